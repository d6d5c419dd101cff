package testcni

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
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
