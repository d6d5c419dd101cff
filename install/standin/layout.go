// Package standin lets harvester-ipam stand in for whereabouts on a node: it
// takes whereabouts' name in the CNI bin dir, so that every NAD naming
// whereabouts reaches harvester-ipam and none is edited, and keeps the real
// binary aside, where harvester-ipam finds its delegate.
package standin

// RealSuffix names the file that holds the real binary while harvester-ipam
// stands in at its name: <bin dir>/whereabouts.real beside <bin dir>/whereabouts.
const RealSuffix = ".real"

// Aside is where the real binary of the plugin at path is kept while
// harvester-ipam stands in for it.
func Aside(path string) string { return path + RealSuffix }
