package conf

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"

	wbtypes "github.com/k8snetworkplumbingwg/whereabouts/pkg/types"
	"golang.org/x/sys/unix"
)

// silenceWhereabouts turns whereabouts' stderr log off once per process for
// quiet loaders: its loader logs at debug level to stderr by default, and
// the setting is a process-wide variable that concurrent loads must not
// write.
var silenceWhereabouts sync.Once

// flatFiles are where whereabouts' loader looks for its flat file, after a
// config's configuration_path (pkg/config GetFlatIPAM, v0.7.0 to v0.9.4).
var flatFiles = []string{
	"/etc/kubernetes/cni/net.d/whereabouts.d/whereabouts.conf",
	FlatFile,
	"/host/etc/cni/net.d/whereabouts.d/whereabouts.conf",
}

// quietLog is a config's ipam object made quiet for whereabouts' loader:
// no log_level of its own, and its flat file a copy without log_file and
// log_level. restore puts them back into what the loader read.
type quietLog struct {
	ipam map[string]json.RawMessage
	// what the loader was kept from: the NAD's log_level, the flat file's
	// log settings, and the configuration_path replaced by the copy's
	level, flatFile, flatLevel string
	confPath, flatConfPath     string
	copied                     bool
	fd                         int
}

// quieten makes ipam quiet for the loader. A flat file or a field that
// does not read as whereabouts reads it is left as it is: the loader then
// fails on it, before it touches its log.
func quieten(ipam map[string]json.RawMessage) (*quietLog, error) {
	q := &quietLog{ipam: ipam, fd: -1}
	if raw, ok := ipam["log_level"]; ok && json.Unmarshal(raw, &q.level) == nil {
		q.ipam = without(ipam, "log_level")
	}
	var candidates []string
	if raw, ok := ipam["configuration_path"]; ok && json.Unmarshal(raw, &q.confPath) == nil && q.confPath != "" {
		candidates = append(candidates, q.confPath)
	}
	path := ""
	for _, c := range append(candidates, flatFiles...) {
		if _, err := os.Stat(c); err == nil || !errors.Is(err, fs.ErrNotExist) {
			path = c // whereabouts' pathExists
			break
		}
	}
	if path == "" {
		return q, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return q, nil
	}
	var flat map[string]json.RawMessage
	if json.Unmarshal(data, &flat) != nil {
		return q, nil
	}
	var file, level string
	rawFile, hasFile := flat["log_file"]
	rawLevel, hasLevel := flat["log_level"]
	if (hasFile && json.Unmarshal(rawFile, &file) != nil) || (hasLevel && json.Unmarshal(rawLevel, &level) != nil) || (!hasFile && !hasLevel) {
		return q, nil
	}
	if q.confPath == "" {
		// whereabouts' merge gives the config the file's own, if any.
		_ = json.Unmarshal(flat["configuration_path"], &q.flatConfPath)
	}
	copied, err := json.Marshal(without(without(flat, "log_file"), "log_level"))
	if err != nil {
		return nil, err
	}
	// The copy lives in memory, named by this process's descriptor: nothing
	// on disk to clean up, and private to the process.
	fd, err := unix.MemfdCreate("whereabouts.conf", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	q.fd = fd
	if _, err := unix.Write(fd, copied); err != nil {
		q.close()
		return nil, fmt.Errorf("write the copy: %w", err)
	}
	at, _ := json.Marshal(fmt.Sprintf("/proc/self/fd/%d", fd))
	q.ipam = with(q.ipam, "configuration_path", at)
	q.flatFile, q.flatLevel, q.copied = file, level, true
	return q, nil
}

// restore gives wb what the loader was kept from, merged as whereabouts
// merges the flat file: a field the config leaves empty takes the file's.
func (q *quietLog) restore(wb *wbtypes.IPAMConfig) {
	if q.level != "" {
		wb.LogLevel = q.level
	} else if q.copied {
		wb.LogLevel = q.flatLevel
	}
	if q.copied {
		if wb.LogFile == "" {
			wb.LogFile = q.flatFile
		}
		wb.ConfigurationPath = q.confPath
		if q.confPath == "" {
			wb.ConfigurationPath = q.flatConfPath
		}
	}
}

func (q *quietLog) close() {
	if q.fd >= 0 {
		_ = unix.Close(q.fd)
		q.fd = -1
	}
}

// without is m less key, as a copy.
func without(m map[string]json.RawMessage, key string) map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(m))
	for k, v := range m {
		if k != key {
			out[k] = v
		}
	}
	return out
}

// with is m with key set, as a copy.
func with(m map[string]json.RawMessage, key string, v json.RawMessage) map[string]json.RawMessage {
	out := without(m, key)
	out[key] = v
	return out
}
