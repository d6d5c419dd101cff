package e2e

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/harvester/harvester-ipam/testcni"
)

// Harvester's network webhook, as the rig runs it for every test, refuses the
// NAD switch: a storage-network NAD's ipam.type changed from whereabouts to
// harvester-ipam. This is why harvester-ipam stands in for whereabouts on
// the node instead. A NAD elsewhere may still name harvester-ipam.
func TestHarvesterRefusesTheNADSwitch(t *testing.T) {
	t.Parallel()
	nads := rig.Dynamic.Resource(testcni.NADResource).Namespace(testcni.HarvesterNamespace)
	const config = `{"cniVersion":"0.3.1","type":"bridge","bridge":"mgmt-br","promiscMode":true,"vlan":50,"ipam":{"type":"whereabouts","range":"192.168.50.0/24","exclude":["192.168.50.1/32","192.168.50.2/32"]}}`
	nad, err := nads.Create(ctx(t), testcni.StorageNetworkNAD("storagenetwork-refused", config), metav1.CreateOptions{})
	require.NoError(t, err, "Harvester creates the storage network's NAD naming whereabouts")
	t.Cleanup(func() { _ = nads.Delete(ctx(t), nad.GetName(), metav1.DeleteOptions{}) })

	switched := nad.DeepCopy()
	require.NoError(t, unstructured.SetNestedField(switched.Object, strings.Replace(config, `"type":"whereabouts"`, `"type":"harvester-ipam"`, 1), "spec", "config"))
	_, err = nads.Update(ctx(t), switched, metav1.UpdateOptions{})
	require.Error(t, err, "the switch to harvester-ipam is refused")
	assert.Contains(t, err.Error(), "can't update nad harvester-system/storagenetwork-refused because it is used by storagenetwork")

	got, err := nads.Get(ctx(t), nad.GetName(), metav1.GetOptions{})
	require.NoError(t, err)
	cfg, _, _ := unstructured.NestedString(got.Object, "spec", "config")
	assert.Equal(t, config, cfg, "the NAD still names whereabouts")

	// The same edit of a NAD that is no storage network's passes: where NADs
	// may be edited, one may name harvester-ipam.
	other := testcni.StorageNetworkNAD("storagenetwork-plain", config)
	other.SetNamespace("default")
	other, err = rig.Dynamic.Resource(testcni.NADResource).Namespace("default").Create(ctx(t), other, metav1.CreateOptions{})
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = rig.Dynamic.Resource(testcni.NADResource).Namespace("default").Delete(ctx(t), "storagenetwork-plain", metav1.DeleteOptions{})
	})
	require.NoError(t, unstructured.SetNestedField(other.Object, strings.Replace(config, `"type":"whereabouts"`, `"type":"harvester-ipam"`, 1), "spec", "config"))
	_, err = rig.Dynamic.Resource(testcni.NADResource).Namespace("default").Update(ctx(t), other, metav1.UpdateOptions{})
	assert.NoError(t, err, "a NAD outside harvester-system may name harvester-ipam")
}
