package shim

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// SetPoolAnnotation sets (or, with "", removes) one annotation of a pool,
// computed by value from the pool as freshly read, with a guarded patch
// retried as every pool write is.
func (s *Store) SetPoolAnnotation(ctx context.Context, pool, key string, value func(*Pool) string) error {
	return s.retry(ctx, func() error {
		p, err := s.Pool(ctx, pool)
		if err != nil || p == nil {
			return err
		}
		want := value(p)
		have, ok := p.Annotations[key]
		if want == have && (ok || want == "") {
			return nil
		}
		cctx, cancel := s.callWrite(ctx)
		defer cancel()
		_, err = s.api.PatchPool(cctx, s.namespace, pool, setAnnotation(p.ResourceVersion, p.Annotations, key, want))
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("annotate pool %s/%s: %w", s.namespace, pool, err)
		}
		return nil
	})
}

// DeletePool deletes a pool that still is what keep, judging it as freshly
// read, says may go: read fresh, judged, then deleted with the UID and
// resourceVersion of that read as preconditions, so that a pool written
// since (an ADD took an address, a release, a sighting) is not deleted on a
// judgement of what it was. It is not retried: a conflict (409) means the
// pool changed, and the caller judges it again on its next look; deleted is
// false then, as it is when the pool is gone or may not go.
func (s *Store) DeletePool(ctx context.Context, name string, mayGo func(*Pool) bool) (deleted bool, err error) {
	p, err := s.Pool(ctx, name)
	if err != nil || p == nil || !mayGo(p) {
		return false, err
	}
	cctx, cancel := s.callWrite(ctx)
	defer cancel()
	err = s.api.DeletePool(cctx, s.namespace, name, Preconditions{UID: p.UID, ResourceVersion: p.ResourceVersion})
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("delete pool %s/%s: %w", s.namespace, name, err)
	}
	return true, nil
}

// MarkReservation sets (or, with "", removes) one annotation of a
// reservation as it was read: a reservation changed since (or gone) is left
// alone, and ok is false; the caller judges it again on its next look.
func (s *Store) MarkReservation(ctx context.Context, o *Reservation, key, value string) (ok bool, err error) {
	if _, has := o.Annotations[key]; value == "" && !has {
		return true, nil
	}
	cctx, cancel := s.callWrite(ctx)
	defer cancel()
	_, err = s.api.PatchReservation(cctx, s.namespace, o.Name, setAnnotation(o.ResourceVersion, o.Annotations, key, value))
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err), apierrors.IsInvalid(err):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("annotate reservation %s/%s: %w", s.namespace, o.Name, err)
	}
	return true, nil
}
