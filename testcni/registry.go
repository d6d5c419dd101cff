package testcni

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os/exec"
	"strings"
	"sync"
)

// PrivateRegistry is a registry that wants a login, as a private one does:
// crane's registry on the machine's address (where the tests push, no
// login), behind a proxy at the machine's localhost (where the nodes pull)
// that answers 401 with a Basic challenge to every request without the
// user and password, and counts what it served and refused.
type PrivateRegistry struct {
	// Host is where the nodes pull from: localhost:<port> on the machine
	// (containerd pulls from localhost over plain HTTP).
	Host string
	// Push is where the tests push to, without a login (crane --insecure).
	Push               string
	User, Password     string
	mu                 sync.Mutex
	served, refused    int
	manifestsWithLogin []string
}

// Counts are the requests the proxy served with the login, those it refused
// without it, and the manifests pulled with it.
func (p *PrivateRegistry) Counts() (served, refused int, manifests []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.served, p.refused, append([]string(nil), p.manifestsWithLogin...)
}

// StartPrivateRegistry starts crane's registry on the machine at
// <machine>:<port> and the proxy that wants user and password at
// 127.0.0.1:<port+1> in the machine's network.
func (r *Rig) StartPrivateRegistry(port int, user, password string) (*PrivateRegistry, func(), error) {
	if r.machine == nil {
		return nil, nil, fmt.Errorf("not a cluster of the rig's own: no machine")
	}
	backend := net.JoinHostPort(r.machine.IP, fmt.Sprint(port))
	stopCrane, err := r.StartOnMachine("registry", r.Tools["crane"], "registry", "serve", "--address", backend)
	if err != nil {
		return nil, nil, err
	}
	p := &PrivateRegistry{Push: backend, User: user, Password: password}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: backend})
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		u, pw, ok := req.BasicAuth()
		if !ok || u != user || pw != password {
			p.mu.Lock()
			p.refused++
			p.mu.Unlock()
			w.Header().Set("WWW-Authenticate", `Basic realm="harvester-ipam rig"`)
			w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		p.mu.Lock()
		p.served++
		if strings.Contains(req.URL.Path, "/manifests/") {
			p.manifestsWithLogin = append(p.manifestsWithLogin, req.Method+" "+req.URL.Path)
		}
		p.mu.Unlock()
		proxy.ServeHTTP(w, req)
	})
	_, stopProxy, err := r.ServeOnMachineAt(net.JoinHostPort("127.0.0.1", fmt.Sprint(port+1)), handler)
	if err != nil {
		stopCrane()
		return nil, nil, err
	}
	p.Host = "localhost:" + fmt.Sprint(port+1)
	return p, func() { stopProxy(); stopCrane() }, nil
}

// Mirror is a registry of the rig's own that a cluster's nodes pull a
// remote registry's images from (containerd's registry mirror, as an
// air-gapped cluster has): crane's registry on the machine. A pod whose
// image is tagged latest is pulled at every start (imagePullPolicy Always);
// with the mirror that pull resolves here, and nothing leaves the machine.
type Mirror struct {
	// Endpoint is the mirror's URL, for NodeOptions.Mirrors.
	Endpoint string
	host     string
	rig      *Rig
}

// StartMirror starts crane's registry on the machine at <machine>:<port>.
func (r *Rig) StartMirror(port int) (*Mirror, func(), error) {
	if r.machine == nil {
		return nil, nil, fmt.Errorf("not a cluster of the rig's own: no machine")
	}
	host := net.JoinHostPort(r.machine.IP, fmt.Sprint(port))
	stop, err := r.StartOnMachine("mirror", r.Tools["crane"], "registry", "serve", "--address", host)
	if err != nil {
		return nil, nil, err
	}
	return &Mirror{Endpoint: "http://" + host, host: host, rig: r}, stop, nil
}

// Push puts img in the mirror under its ref's repository and tag (the
// registry's host left out, as a mirror serves it).
func (m *Mirror) Push(ctx context.Context, img Image) error {
	repo := img.Ref
	if first, rest, ok := strings.Cut(repo, "/"); ok && strings.ContainsAny(first, ".:") {
		repo = rest
	}
	out, err := exec.CommandContext(ctx, m.rig.Tools["crane"], "push", "--insecure", img.Archive, m.host+"/"+repo).CombinedOutput()
	if err != nil {
		return fmt.Errorf("push %s to the mirror %s: %w: %s", img.Ref, m.host, err, out)
	}
	return nil
}
