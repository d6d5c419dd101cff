//go:build race

package agent

// raceEnabled: built with -race, where TestManyRequestsKeepTheDescriptorsFlat
// runs its full 10,000 requests.
const raceEnabled = true
