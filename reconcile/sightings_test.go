package reconcile

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSightingsEncoding(t *testing.T) {
	t0 := time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)
	s := sightings{"4": {holder: holderOf("a"), since: t0}, "12": {holder: holderOf("b"), since: t0}, "5": {holder: holderOf("c"), since: t0.Add(time.Hour)}}
	enc, left := s.encode()
	assert.Empty(t, left)
	u := func(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }
	assert.Equal(t, "v2;"+u(t0)+":4."+holderOf("a")+",12."+holderOf("b")+";"+u(t0.Add(time.Hour))+":5."+holderOf("c"), enc)
	assert.Equal(t, s, decodeSightings(enc))
	empty, _ := sightings{}.encode()
	assert.Equal(t, "", empty)

	// The first format reads on.
	v1 := `{"4":{"id":"a","since":"2026-11-21T12:00:00.5Z","reason":"pod gone"}}`
	assert.Equal(t, sightings{"4": {holder: holderOf("a"), since: t0}}, decodeSightings(v1))
	assert.Empty(t, decodeSightings("{garbage"))
	assert.Empty(t, decodeSightings("v2;x:1.a;5:;6:7,8.b" + strings.Repeat(",", 3))["1"])

	// A budget: the oldest stay, the newest wait.
	big := sightings{}
	for i := 0; i < 20000; i++ {
		since := t0.Add(time.Hour)
		if i < 3000 {
			since = t0
		}
		big[strconv.Itoa(i)] = sighting{holder: holderOf(strconv.Itoa(i)), since: since}
	}
	enc, left = big.encode()
	assert.LessOrEqual(t, len(enc), maxSightingBytes)
	assert.NotEmpty(t, left)
	got := decodeSightings(enc)
	assert.Equal(t, 20000, len(got)+len(left))
	for _, off := range left {
		n, _ := strconv.Atoi(off)
		require.GreaterOrEqual(t, n, 3000, "only newer sightings wait")
	}
}
