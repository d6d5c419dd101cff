package testcni

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// proc is a server the rig runs, with its log in the rig's directory.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan error
	log  string
}

// startProcWith starts a server, its output to its log in dir, with
// attributes set by attr (a chroot, say) and env as the whole environment
// when not nil; it dies with the rig.
func startProcWith(dir, name, bin string, attr func(*syscall.SysProcAttr), env []string, args ...string) (*proc, error) {
	logPath := filepath.Join(dir, name+".log")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = env
	// Die with the rig, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if attr != nil {
		attr(cmd.SysProcAttr)
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan error, 1), log: logPath}
	go func() { p.done <- cmd.Wait(); f.Close() }()
	return p, nil
}

// stop sends SIGTERM, then SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = p.cmd.Process.Kill()
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			// Killed and still not reaped (a process stuck in the kernel):
			// the rig goes on rather than hang the test binary for ever.
			fmt.Fprintf(os.Stderr, "rig: %s (pid %d) did not exit 10s after SIGKILL; left behind\n", p.name, p.cmd.Process.Pid)
		}
	}
}

func (p *proc) exited() bool {
	select {
	case err := <-p.done:
		p.done <- err
		return true
	default:
		return false
	}
}

// tail is the end of a server's log, for error messages.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// cluster is etcd and kube-apiserver with throwaway credentials: on the
// rig's loopback, or on a machine of its own (clusterOptions.machine).
type cluster struct {
	dir       string
	tools     Tools
	opt       clusterOptions
	etcd, api *proc
	etcdURL   string
	apiPort   int
	token     string
	caFile    string
	apiArgs   []string
	// kubeletCA is the CA the kubelets of a machine's cluster trust for
	// client certificates: the API server's, for exec, attach and logs.
	kubeletCA string
}

// clusterOptions place a cluster: on the rig's loopback (the zero value), or
// on a machine of its own (a network namespace), where its servers listen on
// the machine's address and run with every admission plugin a cluster has
// by default.
type clusterOptions struct {
	machine *machine
}

// host is the address the cluster's servers listen on and are reached at.
func (c *cluster) host() string {
	if c.opt.machine != nil {
		return c.opt.machine.IP
	}
	return "127.0.0.1"
}

// start runs one of the cluster's servers, on its machine when it has one.
func (c *cluster) start(name, bin string, env []string, args ...string) (*proc, error) {
	return c.opt.machine.startProc(c.dir, name, bin, env, args...)
}

func startCluster(ctx context.Context, dir string, tools Tools, opt clusterOptions) (*cluster, error) {
	c := &cluster{dir: dir, tools: tools, opt: opt}
	if err := c.startEtcd(ctx); err != nil {
		return nil, err
	}
	if err := c.prepareAPIServer(); err != nil {
		c.stop()
		return nil, err
	}
	if err := c.StartAPIServer(ctx); err != nil {
		c.stop()
		return nil, err
	}
	return c, nil
}

func (c *cluster) startEtcd(ctx context.Context) error {
	// A machine of its own has every port free: etcd's own.
	cp, pp, err := 2379, 2380, error(nil)
	if c.opt.machine == nil {
		if cp, err = freePort(); err != nil {
			return err
		}
		if pp, err = freePort(); err != nil {
			return err
		}
	}
	c.etcdURL = fmt.Sprintf("http://%s:%d", c.host(), cp)
	peer := fmt.Sprintf("http://%s:%d", c.host(), pp)
	c.etcd, err = c.start("etcd", c.tools["etcd"], nil,
		"--name=rig", "--data-dir="+filepath.Join(c.dir, "etcd"),
		"--listen-client-urls="+c.etcdURL, "--advertise-client-urls="+c.etcdURL,
		"--listen-peer-urls="+peer, "--initial-advertise-peer-urls="+peer,
		"--initial-cluster=rig="+peer, "--unsafe-no-fsync", "--log-level=warn")
	if err != nil {
		return err
	}
	return waitFor(ctx, 60*time.Second, c.etcd, func() error {
		resp, err := http.Get(c.etcdURL + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("etcd /health: %s", resp.Status)
		}
		return nil
	})
}

func (c *cluster) prepareAPIServer() error {
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	saKey := filepath.Join(c.dir, "sa.key")
	if err := os.WriteFile(saKey, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}), 0o600); err != nil {
		return err
	}
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.token = hex.EncodeToString(tok)
	tokens := filepath.Join(c.dir, "tokens.csv")
	if err := os.WriteFile(tokens, []byte(c.token+",admin,admin,system:masters\n"), 0o600); err != nil {
		return err
	}
	certDir := filepath.Join(c.dir, "apiserver-certs")
	c.caFile = filepath.Join(certDir, "apiserver.crt")
	c.apiArgs = []string{
		"--etcd-servers=" + c.etcdURL,
		"--cert-dir=" + certDir,
		"--token-auth-file=" + tokens, "--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc", "--service-account-key-file=" + saKey,
		"--service-account-signing-key-file=" + saKey, "--service-cluster-ip-range=" + ServiceCIDR,
		// On SIGTERM, close the open watches (the webhook's informers hold
		// a dozen) after 2 s; by default the HTTP server waits for them up to
		// the request timeout, and a test that stops the API server waits
		// out its 20 s grace instead of about 1 s.
		"--shutdown-send-retry-after=true",
	}
	if m := c.opt.machine; m != nil {
		// A machine's cluster runs pods: kube-apiserver's own port, on every
		// address of the machine (so that its self-signed certificate names
		// localhost too), advertised at the machine's address, which the
		// certificate names with the kubernetes Service's ClusterIP; and the
		// default admission plugins, ServiceAccount's token volumes among them.
		c.apiPort = 6443
		ca, cert, key, err := kubeletClientCerts(filepath.Join(c.dir, "kubelet-client"))
		if err != nil {
			return err
		}
		c.kubeletCA = ca
		c.apiArgs = append(c.apiArgs, "--bind-address=0.0.0.0", "--advertise-address="+m.IP, "--secure-port=6443",
			// Harvester's whereabouts runs privileged, as RKE2's API server allows.
			"--allow-privileged=true",
			// kubectl exec, attach and logs reach the kubelet as on any
			// cluster: by the node's address, with a client certificate
			// the kubelet trusts.
			"--kubelet-client-certificate="+cert, "--kubelet-client-key="+key,
			"--kubelet-preferred-address-types=InternalIP")
		return nil
	}
	if c.apiPort, err = freePort(); err != nil {
		return err
	}
	c.apiArgs = append(c.apiArgs,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--endpoint-reconciler-type=none",
		"--secure-port="+strconv.Itoa(c.apiPort),
		// No controller-manager makes default ServiceAccounts; pods are objects here, not workloads.
		"--disable-admission-plugins=ServiceAccount")
	return nil
}

// StartAPIServer starts kube-apiserver (again, after StopAPIServer) on its port.
func (c *cluster) StartAPIServer(ctx context.Context) error {
	var err error
	if c.api, err = c.start("kube-apiserver", c.tools["kube-apiserver"], nil, c.apiArgs...); err != nil {
		return err
	}
	return waitFor(ctx, 90*time.Second, c.api, func() error {
		pool := x509.NewCertPool()
		ca, err := os.ReadFile(c.caFile)
		if err != nil {
			return err
		}
		pool.AppendCertsFromPEM(ca)
		hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
		req, _ := http.NewRequest("GET", c.URL()+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+c.token)
		resp, err := hc.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("kube-apiserver /readyz: %s", resp.Status)
		}
		return nil
	})
}

// StopAPIServer stops kube-apiserver, leaving etcd and its data.
func (c *cluster) StopAPIServer() {
	c.api.stop(20 * time.Second)
	c.api = nil
}

func (c *cluster) URL() string { return fmt.Sprintf("https://%s:%d", c.host(), c.apiPort) }

// stop ends kube-apiserver before etcd: the other way round it hangs on SIGTERM.
func (c *cluster) stop() {
	if c.api != nil {
		c.api.stop(20 * time.Second)
	}
	if c.etcd != nil {
		c.etcd.stop(10 * time.Second)
	}
}

// kubeconfig is a kubeconfig for the admin token, whose context's namespace
// is where whereabouts keeps its pools.
func (c *cluster) kubeconfig(namespace string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: rig
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: rig
  context:
    cluster: rig
    user: admin
    namespace: %s
current-context: rig
`, c.URL(), c.caFile, c.token, namespace)
}

func waitFor(ctx context.Context, limit time.Duration, p *proc, ready func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, limit, true, func(context.Context) (bool, error) {
		if p.exited() {
			return false, fmt.Errorf("%s exited while starting; its log ends:\n%s", p.name, p.tail())
		}
		last = ready()
		return last == nil, nil
	})
	if err != nil && wait.Interrupted(err) {
		return errors.Join(fmt.Errorf("%s not ready after %s; its log ends:\n%s", p.name, limit, p.tail()), last)
	}
	return err
}
