package standin

import (
	"errors"
	"fmt"
	"os/exec"
	"syscall"
)

// RunError says what the error of running a binary (exec.Cmd's Run) tells
// of the file, for a Probe: ErrBusy when a writer still has it open
// (ETXTBSY), ErrBroken when it cannot run whatever happens around it (not an
// executable, a crash, an exit with an error), wrapped with err. Anything
// else, a kill (the node out of memory, a timeout) or a failure to start a
// process at all, says nothing about the file: err as it is.
func RunError(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, syscall.ETXTBSY) {
		return fmt.Errorf("%w: %w", err, ErrBusy)
	}
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		if ws, ok := exit.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			return err
		}
		return fmt.Errorf("%w: %w", err, ErrBroken)
	}
	if errors.Is(err, syscall.ENOEXEC) || errors.Is(err, syscall.EACCES) {
		return fmt.Errorf("%w: %w", err, ErrBroken)
	}
	return err
}
