package install

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A plugin as far as the installer can tell: it answers VERSION as skel does.
const fakePlugin = `#!/bin/sh
if [ "$CNI_COMMAND" = VERSION ]; then
  echo '{"cniVersion":"1.1.0","supportedVersions":["0.3.1","1.0.0","1.1.0"]}'
  exit 0
fi
echo "harvester-ipam @V@: test plugin" >&2
`

func script(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o755))
	return p
}

func plugin(t *testing.T, version string) string {
	return script(t, t.TempDir(), "harvester-ipam", strings.ReplaceAll(fakePlugin, "@V@", version))
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	st, err := os.Stat(p)
	require.NoError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

func entries(t *testing.T, dir string) []string {
	t.Helper()
	es, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names
}

func TestInstallFreshThenAgainThenUpgrade(t *testing.T) {
	bin := t.TempDir()
	v1 := plugin(t, "v1")
	res, err := Install(context.Background(), Options{Source: v1, BinDir: bin})
	require.NoError(t, err)
	assert.True(t, res.Changed)
	assert.Equal(t, "harvester-ipam v1: test plugin", res.About)
	assert.Equal(t, []string{"0.3.1", "1.0.0", "1.1.0"}, res.Supported)
	dst := filepath.Join(bin, "harvester-ipam")
	st, err := os.Stat(dst)
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o755), st.Mode().Perm())
	ino := inode(t, dst)

	// Again: nothing written, the same file.
	res, err = Install(context.Background(), Options{Source: v1, BinDir: bin})
	require.NoError(t, err)
	assert.False(t, res.Changed)
	assert.Equal(t, ino, inode(t, dst), "an up-to-date binary is not rewritten")
	_, err = Verify(context.Background(), Options{Source: v1, BinDir: bin})
	require.NoError(t, err)

	// Another version: replaced by rename (a new inode), nothing else left.
	v2 := plugin(t, "v2")
	_, err = Verify(context.Background(), Options{Source: v2, BinDir: bin})
	require.ErrorContains(t, err, "is not the image's")
	res, err = Install(context.Background(), Options{Source: v2, BinDir: bin})
	require.NoError(t, err)
	assert.True(t, res.Changed)
	assert.Equal(t, "harvester-ipam v2: test plugin", res.About)
	assert.NotEqual(t, ino, inode(t, dst))
	assert.Equal(t, []string{"harvester-ipam"}, entries(t, bin))
}

func TestBrokenSourceLeavesTheOldBinary(t *testing.T) {
	bin := t.TempDir()
	old := plugin(t, "old")
	_, err := Install(context.Background(), Options{Source: old, BinDir: bin})
	require.NoError(t, err)
	dst := filepath.Join(bin, "harvester-ipam")
	before, err := os.ReadFile(dst)
	require.NoError(t, err)

	for name, src := range map[string]string{
		"exits 1":           script(t, t.TempDir(), "p", "#!/bin/sh\necho broken >&2\nexit 1\n"),
		"prints no version": script(t, t.TempDir(), "p", "#!/bin/sh\necho hello\n"),
		"not executable":    script(t, t.TempDir(), "p", "\x7fELF garbage"),
		"no 0.3.1":          script(t, t.TempDir(), "p", "#!/bin/sh\necho '{\"cniVersion\":\"1.1.0\",\"supportedVersions\":[\"1.1.0\"]}'\n"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Install(context.Background(), Options{Source: src, BinDir: bin})
			require.Error(t, err)
			assert.Contains(t, err.Error(), "the new binary does not run")
			assert.Contains(t, err.Error(), dst+" left as it was")
			after, rerr := os.ReadFile(dst)
			require.NoError(t, rerr)
			assert.Equal(t, before, after, "the old binary is untouched")
			assert.Equal(t, []string{"harvester-ipam"}, entries(t, bin), "no temporary file left")
		})
	}
	_, err = Install(context.Background(), Options{Source: filepath.Join(t.TempDir(), "missing"), BinDir: bin})
	require.ErrorContains(t, err, "source binary")
}

func TestBadOptions(t *testing.T) {
	src := plugin(t, "v1")
	_, err := Install(context.Background(), Options{Source: src, BinDir: filepath.Join(t.TempDir(), "nope")})
	require.ErrorContains(t, err, "is the host path right?")
	_, err = Install(context.Background(), Options{Source: src, BinDir: "relative/bin"})
	require.ErrorContains(t, err, "absolute")
	_, err = Install(context.Background(), Options{Source: src, BinDir: t.TempDir(), Name: "../x"})
	require.ErrorContains(t, err, "plain file name")
}

// A killed installer's temporary file is removed by the next run.
func TestLeftoverTempRemoved(t *testing.T) {
	bin := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(bin, tempPrefix+"123"), []byte("half"), 0o600))
	_, err := Install(context.Background(), Options{Source: plugin(t, "v1"), BinDir: bin})
	require.NoError(t, err)
	assert.Equal(t, []string{"harvester-ipam"}, entries(t, bin))
}

// Installers racing on one node take turns; the result is one good binary.
func TestConcurrentInstalls(t *testing.T) {
	bin := t.TempDir()
	srcs := []string{plugin(t, "a"), plugin(t, "b"), plugin(t, "c"), plugin(t, "d")}
	var wg sync.WaitGroup
	errs := make([]error, len(srcs))
	for i, s := range srcs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = Install(context.Background(), Options{Source: s, BinDir: bin})
		}()
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"harvester-ipam"}, entries(t, bin))
	ok := 0
	for _, s := range srcs {
		if _, err := Verify(context.Background(), Options{Source: s, BinDir: bin}); err == nil {
			ok++
		}
	}
	assert.Equal(t, 1, ok, "the binary is exactly one of the sources")
}

func TestPreflight(t *testing.T) {
	bin := t.TempDir()
	flat := filepath.Join(t.TempDir(), "whereabouts.conf")
	w := Preflight(bin, "whereabouts", flat)
	require.Len(t, w, 2)
	assert.Contains(t, w[0], "no executable whereabouts in "+bin)
	assert.Contains(t, w[1], "no whereabouts flat file "+flat)
	script(t, bin, "whereabouts", "#!/bin/sh\n")
	require.NoError(t, os.WriteFile(flat, []byte("{}"), 0o600))
	assert.Empty(t, Preflight(bin, "whereabouts", flat))
}
