package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/harvester/harvester-ipam/conf/names"
	"github.com/harvester/harvester-ipam/shim"
)

// health is why the agent cannot serve now; "" when it can.
type health struct{ reason string }

// notChecked is the health of an agent that has not reached the API server
// yet.
var notChecked = &health{reason: "not yet connected to the API server"}

// Check reads, as the agent, what its verbs read in each namespace it
// serves: a pool, a reservation, whereabouts' Lease. Until a Check
// succeeds, and after one fails, the agent declines every request: the
// plugin then works alone, with whereabouts' credentials, rather than fail
// an ADD for want of the agent's (an API server it cannot reach, a Role
// not granted).
func (s *Server) Check(ctx context.Context) error {
	err := s.check(ctx)
	h := &health{}
	if err != nil {
		h.reason = "cannot reach the pools as itself: " + err.Error()
	}
	if prev := s.health.Swap(h); prev.reason != h.reason {
		if err != nil {
			s.log.Printf("declining every request: %v", err)
		} else {
			s.log.Printf("serving: the pools of %v answer", s.o.Namespaces)
		}
	}
	return err
}

func (s *Server) check(ctx context.Context) error {
	for _, ns := range s.o.Namespaces {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := s.o.API.ListPools(cctx, ns, shim.Page{Limit: 1})
		if err == nil {
			_, _, err = s.o.API.ListReservations(cctx, ns, shim.Page{Limit: 1})
		}
		if err == nil {
			_, err = s.o.API.GetLease(cctx, ns, names.Lease)
			if apierrors.IsNotFound(err) {
				err = nil
			}
		}
		cancel()
		if err != nil {
			return fmt.Errorf("namespace %s: %w", ns, err)
		}
	}
	return nil
}

// Watch runs Check every interval until ctx ends.
func (s *Server) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.Check(ctx); err != nil && errors.Is(err, context.Canceled) {
				return
			}
		}
	}
}
