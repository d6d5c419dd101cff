package shim

import (
	"context"
	"fmt"
	"os"
	"time"
)

// TraceAPI logs each call's duration to stderr (temporary debugging).
type TraceAPI struct{ API }

func tr(what string, start time.Time) {
	fmt.Fprintf(os.Stderr, "%s TRACE %s %s\n", time.Now().Format("15:04:05.000000"), what, time.Since(start).Round(10*time.Microsecond))
}
func (t TraceAPI) GetPool(ctx context.Context, ns, name string, from Source) (*Pool, error) {
	defer tr(fmt.Sprintf("get pool %s from %d", name, from), time.Now())
	return t.API.GetPool(ctx, ns, name, from)
}
func (t TraceAPI) ListPools(ctx context.Context, ns string, page Page) ([]Pool, string, error) {
	defer tr("list pools", time.Now())
	return t.API.ListPools(ctx, ns, page)
}
func (t TraceAPI) PatchPool(ctx context.Context, ns, name string, patch Patch) (*Pool, error) {
	defer tr("patch pool "+name, time.Now())
	return t.API.PatchPool(ctx, ns, name, patch)
}
func (t TraceAPI) GetReservation(ctx context.Context, ns, name string) (*Reservation, error) {
	defer tr("get reservation "+name, time.Now())
	return t.API.GetReservation(ctx, ns, name)
}
func (t TraceAPI) DeleteReservation(ctx context.Context, ns, name string, pre Preconditions) error {
	defer tr("delete reservation "+name, time.Now())
	return t.API.DeleteReservation(ctx, ns, name, pre)
}
func (t TraceAPI) CreateReservation(ctx context.Context, ns string, o *Reservation) (*Reservation, error) {
	defer tr("create reservation "+o.Name, time.Now())
	return t.API.CreateReservation(ctx, ns, o)
}
func (t TraceAPI) GetLease(ctx context.Context, ns, name string) (*Lease, error) {
	defer tr("get lease", time.Now())
	return t.API.GetLease(ctx, ns, name)
}
func (t TraceAPI) UpdateLease(ctx context.Context, l *Lease) (*Lease, error) {
	h := ""
	if l.Spec.HolderIdentity != nil {
		h = *l.Spec.HolderIdentity
	}
	defer tr("update lease holder="+h, time.Now())
	return t.API.UpdateLease(ctx, l)
}
