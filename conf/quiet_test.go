package conf

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// openFDs counts this process's descriptors of the file at path, and of
// memory files (the quiet loader's copies).
func openFDs(t *testing.T, path string) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	n := 0
	for _, fd := range fds {
		target, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err == nil && (target == path || strings.HasPrefix(target, "/memfd:")) {
			n++
		}
	}
	return n
}

// A quiet loader reads every config as Load does: the same pools, options,
// delegated bytes, and log settings merged as whereabouts merges them.
func TestAQuietLoaderReadsWhatLoadReads(t *testing.T) {
	dir := t.TempDir()
	flatLog := filepath.Join(dir, "flat.log")
	nadLog := filepath.Join(dir, "nad.log")
	plain := flatFile(t, `{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/k"}}`)
	logged := flatFile(t, `{"datastore":"kubernetes","kubernetes":{"kubeconfig":"/k"},"log_file":"`+flatLog+`","log_level":"verbose","configuration_path":"/elsewhere"}`)
	levelOnly := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"},"log_level":"error"}`)
	badLevel := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"},"log_level":7}`)
	for _, tc := range []struct{ name, ipam string }{
		{"a flat file without logs", `"configuration_path":"` + plain + `"`},
		{"the flat file's log settings", `"configuration_path":"` + logged + `"`},
		{"the NAD's beside the flat file's", `"configuration_path":"` + logged + `","log_file":"` + nadLog + `","log_level":"debug"`},
		{"the NAD's level only", `"configuration_path":"` + plain + `","log_level":"debug"`},
		{"the flat file's level only", `"configuration_path":"` + levelOnly + `"`},
		{"a flat file whose level is no string", `"configuration_path":"` + badLevel + `"`},
		{"a NAD level that is no string", `"configuration_path":"` + plain + `","log_level":7`},
		{"no flat file", `"configuration_path":"/nonexistent/whereabouts.conf"`},
		{"a bad range", `"configuration_path":"` + logged + `","range":"10.0.0.0/33"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ipam := `{"type":"harvester-ipam","range":"10.0.0.0/24","exclude":["10.0.0.1/32"],` + tc.ipam + `}`
			if strings.Contains(tc.ipam, `"range"`) {
				ipam = `{"type":"harvester-ipam",` + tc.ipam + `}`
			}
			want, wantErr := Load(nad(ipam))
			got, gotErr := Loader{Quiet: true}.Load(nad(ipam))
			assert.Equal(t, wantErr, gotErr)
			assert.Equal(t, want, got)
		})
	}
}

// whereabouts' loader opens the log file it reads at every load and never
// closes it: a daemon that loads a config per request with Load would run
// out of descriptors, and create the log file. A quiet loader opens nothing.
//
// The garbage collector closes an unreachable *os.File, so with it running
// Load's leak shows fewer descriptors than loads (CI saw 8 of 10) and a leak
// of the quiet loader's could hide: the collector is off for the test.
func TestAQuietLoaderOpensNoFile(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	dir := t.TempDir()
	flatLog := filepath.Join(dir, "flat.log")
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"},"log_file":"`+flatLog+`","log_level":"debug"}`)
	stdin := nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + flat + `"}`)

	require.Equal(t, 0, openFDs(t, flatLog))
	for i := 0; i < 200; i++ {
		c, err := Loader{Quiet: true}.Load(stdin)
		require.NoError(t, err)
		require.Equal(t, flatLog, c.LogFile())
		require.Equal(t, "debug", c.LogLevel())
	}
	assert.Equal(t, 0, openFDs(t, flatLog), "descriptors left open")
	_, err := os.Stat(flatLog)
	assert.True(t, os.IsNotExist(err), "the quiet loader created the log file")

	// What the quiet loader avoids: Load leaves one descriptor per load.
	for i := 0; i < 10; i++ {
		_, err := Load(stdin)
		require.NoError(t, err)
	}
	assert.Equal(t, 10, openFDs(t, flatLog), "Load's loader keeps its log file open")
}

// Quiet loads run concurrently (a node agent's requests); run under -race.
func TestQuietLoadsRunConcurrently(t *testing.T) {
	dir := t.TempDir()
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"},"log_file":"`+filepath.Join(dir, "w.log")+`","log_level":"debug"}`)
	stdin := nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + flat + `","log_level":"verbose"}`)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				c, err := Loader{Quiet: true}.Load(stdin)
				if err != nil || c.LogLevel() != "verbose" {
					t.Errorf("load: %v, level %q", err, c.LogLevel())
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Whereabouts is the IPAM config as whereabouts' binary reads it: the pod,
// the static addresses CNI_ARGS names, and the config's cniVersion.
func TestALoaderReadsCNIArgsWhenAsked(t *testing.T) {
	flat := flatFile(t, `{"kubernetes":{"kubeconfig":"/k"}}`)
	stdin := nad(`{"type":"harvester-ipam","range":"10.0.0.0/24","configuration_path":"` + flat + `"}`)
	wb, version, err := Loader{Quiet: true}.Whereabouts(stdin, "IgnoreUnknown=true;K8S_POD_NAMESPACE=ns;K8S_POD_NAME=p;IP=10.0.0.9/24;GATEWAY=10.0.0.1")
	require.NoError(t, err)
	assert.Equal(t, "ns", wb.PodNamespace)
	assert.Equal(t, "p", wb.PodName)
	require.Len(t, wb.Addresses, 1)
	assert.Equal(t, "10.0.0.9/24", wb.Addresses[0].Address.String())
	assert.Equal(t, "10.0.0.1", wb.Addresses[0].Gateway.String())
	var top struct {
		CNIVersion string `json:"cniVersion"`
	}
	require.NoError(t, json.Unmarshal(stdin, &top))
	assert.Equal(t, top.CNIVersion, version)

	plain, err := Load(stdin)
	require.NoError(t, err)
	assert.Empty(t, plain.IPAM.Addresses, "the plugin leaves CNI_ARGS to the delegate")
	assert.Empty(t, plain.IPAM.PodName)

	_, _, err = Loader{}.Whereabouts(stdin, "IP=bogus")
	assert.ErrorContains(t, err, "bogus")
}
