package conf

import (
	"fmt"
	"strings"
)

// PoolName is the name of the IPPool whereabouts keeps a range in:
// "192.168.50.0/24" -> "192.168.50.0-24", "fd00:10::/64" -> "fd00-10---64",
// and with a network_name, "blue-192.168.50.0-24".
//
// It mirrors whereabouts' storage/kubernetes.IPPoolName, whose package would
// add ~500 packages to a binary every sandbox execs; a test holds the two equal.
func PoolName(ipRange, networkName string) string {
	n := ipRange
	if strings.HasSuffix(n, ":") {
		n += "0"
	}
	n = strings.ReplaceAll(n, ":", "-")
	n = strings.ReplaceAll(n, "/", "-")
	if networkName == "" {
		return n
	}
	return fmt.Sprintf("%s-%s", networkName, n)
}
