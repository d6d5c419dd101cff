package conf

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
)

// maxFileSize bounds what a config may make the plugin read: a flat file or a
// kubeconfig is a few KiB.
const maxFileSize = 1 << 20

// checkFile refuses a path that is not a regular file of sane size: a NAD
// author must not make the root plugin on every node block on a FIFO or read
// /dev/zero. A path that does not exist is left to the loader's own message.
func checkFile(what, path string) error {
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w", what, path, err)
	}
	if !st.Mode().IsRegular() {
		return fmt.Errorf("%s %s is not a regular file (%s)", what, path, st.Mode().Type())
	}
	if st.Size() > maxFileSize {
		return fmt.Errorf("%s %s is %d bytes; at most %d are read", what, path, st.Size(), maxFileSize)
	}
	return nil
}
