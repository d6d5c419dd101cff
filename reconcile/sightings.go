package reconcile

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// StaleSinceAnnotation, on an IPPool, records when each of its stale entries
// was first seen stale, so that the grace period spans passes (and CronJob
// runs).
//
// The API server refuses an object whose annotations exceed 256 KiB; a pool
// with thousands of stale entries (a large range after a node loss) must not
// overflow it, or no sighting is ever recorded and nothing released: the leak
// would be permanent exactly when it is largest. So a sighting is small (the
// offset and a short hash of the container ID, grouped by the second first
// seen: about 16 bytes), and the record has a budget: entries beyond it are
// sighted on a later pass, once earlier ones are released.
const StaleSinceAnnotation = "harvester-ipam.harvesterhci.io/stale-since"

// maxSightingBytes bounds the annotation, well within the API server's limit
// on all of an object's annotations.
const maxSightingBytes = 128 << 10

// sighting is the first time an entry was seen stale, and whose it was then.
type sighting struct {
	holder string // holderOf(container ID)
	since  time.Time
}

// sightings are a pool's, by offset.
type sightings map[string]sighting

// holderOf is the short name of a container ID kept in a sighting: an entry
// that changed hands since (another container) is seen anew.
func holderOf(containerID string) string {
	sum := sha256.Sum256([]byte(containerID))
	return hex.EncodeToString(sum[:4])
}

// encode writes sightings as "v2;<unix>:<offset>.<holder>,...;<unix>:...",
// oldest first, up to maxSightingBytes; it returns the offsets left out.
func (s sightings) encode() (string, []string) {
	bySince := map[int64][]string{}
	for off, x := range s {
		bySince[x.since.Unix()] = append(bySince[x.since.Unix()], off)
	}
	times := make([]int64, 0, len(bySince))
	for t := range bySince {
		times = append(times, t)
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })
	var b strings.Builder
	b.WriteString("v2")
	var left []string
	full := false
	for _, t := range times {
		offs := bySince[t]
		sort.Slice(offs, func(i, j int) bool { return offsetLess(offs[i], offs[j]) })
		group := ";" + strconv.FormatInt(t, 10) + ":"
		started := false
		for _, off := range offs {
			item := off + "." + s[off].holder
			need := len(item) + 1
			if !started {
				need += len(group)
			}
			if full || b.Len()+need > maxSightingBytes {
				full = true // the rest wait: newer sightings never displace older ones
				left = append(left, off)
				continue
			}
			if !started {
				b.WriteString(group)
				started = true
			} else {
				b.WriteByte(',')
			}
			b.WriteString(item)
		}
	}
	if b.Len() == len("v2") {
		return "", left
	}
	return b.String(), left
}

// decodeSightings reads the annotation, in this format or the first one
// (JSON: offset -> {id, since}); what does not parse is forgotten, so its
// grace starts again: never sooner.
func decodeSightings(raw string) sightings {
	out := sightings{}
	if raw == "" {
		return out
	}
	if rest, ok := strings.CutPrefix(raw, "v2"); ok {
		for _, group := range strings.Split(rest, ";") {
			ts, items, ok := strings.Cut(group, ":")
			if !ok {
				continue
			}
			sec, err := strconv.ParseInt(ts, 10, 64)
			if err != nil {
				continue
			}
			for _, item := range strings.Split(items, ",") {
				off, holder, ok := strings.Cut(item, ".")
				if ok && off != "" && holder != "" {
					out[off] = sighting{holder: holder, since: time.Unix(sec, 0).UTC()}
				}
			}
		}
		return out
	}
	var v1 map[string]struct {
		ID    string    `json:"id"`
		Since time.Time `json:"since"`
	}
	if json.Unmarshal([]byte(raw), &v1) == nil {
		for off, x := range v1 {
			out[off] = sighting{holder: holderOf(x.ID), since: x.Since.UTC().Truncate(time.Second)}
		}
	}
	return out
}

func offsetLess(a, b string) bool {
	x, errA := strconv.ParseUint(a, 10, 64)
	y, errB := strconv.ParseUint(b, 10, 64)
	if errA != nil || errB != nil {
		return a < b
	}
	return x < y
}

// String is for tests and logs.
func (s sighting) String() string {
	return fmt.Sprintf("%s since %s", s.holder, s.since.Format(time.RFC3339))
}
