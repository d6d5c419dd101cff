package plugin

import (
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// level follows whereabouts' log_level names.
type level int

const (
	levelError level = iota
	levelVerbose
	levelDebug
)

// logger writes to whereabouts' log_file, or to stderr; never to stdout, which
// carries the CNI result. It is handed only messages we compose, so neither a
// kubeconfig nor a token can reach it.
type logger struct {
	w     io.Writer
	close func()
	max   level
	verb  string
	id    string
}

// newLogger opens the log: whereabouts' log_file when set (shared with it, so
// one file tells the whole story of an attachment), else fallback.
// A file's lines go to toFile(file) instead, when toFile is set.
func newLogger(file, lvl string, fallback io.Writer, verb, containerID string, toFile func(string) io.Writer) *logger {
	l := &logger{w: fallback, close: func() {}, max: levelVerbose, verb: verb, id: containerID}
	switch strings.ToLower(lvl) {
	case "debug":
		l.max = levelDebug
	case "error", "panic":
		l.max = levelError
	}
	if file != "" && toFile != nil {
		l.w = toFile(file)
	} else if file != "" {
		f, err := os.OpenFile(file, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
		if err == nil {
			l.w, l.close = f, func() { f.Close() }
		} else {
			fmt.Fprintf(fallback, "harvester-ipam: cannot open log_file %s: %v; logging to stderr\n", file, err)
		}
	}
	return l
}

func (l *logger) printf(lv level, format string, a ...any) {
	if l == nil || lv > l.max {
		return
	}
	names := [...]string{"error", "verbose", "debug"}
	fmt.Fprintf(l.w, "%s [%s] harvester-ipam %s %s: %s\n",
		time.Now().Format(time.RFC3339), names[lv], l.verb, l.id, fmt.Sprintf(format, a...))
}

func (l *logger) Errorf(format string, a ...any)   { l.printf(levelError, format, a...) }
func (l *logger) Verbosef(format string, a ...any) { l.printf(levelVerbose, format, a...) }
func (l *logger) Debugf(format string, a ...any)   { l.printf(levelDebug, format, a...) }
