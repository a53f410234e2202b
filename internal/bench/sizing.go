package bench

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Sizing turns the fleet measurement into what to give ctrl and MariaDB
// for a fleet of a given size: the table of docs/operating.md ("Sizing")
// and the resources of the HA overlay (deploy/check holds the overlay to
// its row). The rule, from figures one ctrl printed carrying the whole
// fleet (make bench-fleet, the streaming design):
//
//   - replicas: 2 at every size. The measurement is one replica carrying
//     every stream, and after a roll or a replica's loss one replica
//     does, until streams rebalance; the second is for availability.
//   - CPU request: the measured cores times 1.5, rounded up to a quarter
//     core (at least a quarter); no CPU limit (throttling a stream
//     server delays every delivery).
//   - memory request: the measured RSS rounded up to 128 MiB; limit: the
//     RSS times 1.5 rounded up to 256 MiB (bootstraps after a roll
//     allocate on top of the steady state).
//   - MariaDB: the statements per second measured, at the measured
//     write rate.
type SizingRow struct {
	Clusters   int
	Streams    float64
	Rate       float64 // operator writes per second during the measurement
	CtrlCores  float64 // measured
	CtrlRSSMiB float64 // measured
	Statements float64 // MariaDB statements per second, measured

	Replicas      int
	CPURequestM   int // millicores
	MemRequestMiB int
	MemLimitMiB   int
}

// CPURequest and the memory settings as Kubernetes quantities.
func (s SizingRow) CPURequest() string { return fmt.Sprintf("%dm", s.CPURequestM) }

// MemoryRequest is the memory request as a Kubernetes quantity.
func (s SizingRow) MemoryRequest() string { return fmt.Sprintf("%dMi", s.MemRequestMiB) }

// MemoryLimit is the memory limit as a Kubernetes quantity.
func (s SizingRow) MemoryLimit() string { return fmt.Sprintf("%dMi", s.MemLimitMiB) }

func roundUp(v, step float64) float64 { return math.Ceil(v/step) * step }

// Sizing computes a row per fleet size of results.json's fleet section.
func Sizing(r *Results) ([]SizingRow, error) {
	s, ok := r.Section("fleet")
	if !ok {
		return nil, fmt.Errorf("section fleet is not in results.json: make bench-fleet measures it")
	}
	byN := map[int]*SizingRow{}
	for _, f := range s.Figures {
		parts := strings.Split(f.Key, "/")
		if len(parts) != 3 || parts[0] != string(streaming) {
			continue
		}
		n, err := strconv.Atoi(parts[1])
		if err != nil {
			continue
		}
		row := byN[n]
		if row == nil {
			row = &SizingRow{Clusters: n}
			byN[n] = row
		}
		switch parts[2] {
		case "cpu":
			row.CtrlCores = f.Value
		case "rss":
			row.CtrlRSSMiB = f.Value
		case "statements":
			row.Statements = f.Value
		case "streams":
			row.Streams = f.Value
		}
		if _, rate, ok := strings.Cut(f.Name, " clusters, "); ok {
			if v, err := strconv.ParseFloat(strings.SplitN(rate, " ", 2)[0], 64); err == nil {
				row.Rate = v
			}
		}
	}
	var out []SizingRow
	for _, row := range byN {
		if row.CtrlCores == 0 || row.CtrlRSSMiB == 0 {
			continue
		}
		row.Replicas = 2
		row.CPURequestM = int(max(250, roundUp(row.CtrlCores*1.5*1000, 250)))
		row.MemRequestMiB = int(roundUp(row.CtrlRSSMiB, 128))
		row.MemLimitMiB = int(roundUp(row.CtrlRSSMiB*1.5, 256))
		out = append(out, *row)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("section fleet has no streaming figures of ctrl's CPU and RSS")
	}
	slices.SortFunc(out, func(a, b SizingRow) int { return a.Clusters - b.Clusters })
	return out, nil
}

// SizingFor is the row for exactly n clusters.
func SizingFor(r *Results, n int) (SizingRow, error) {
	rows, err := Sizing(r)
	if err != nil {
		return SizingRow{}, err
	}
	for _, row := range rows {
		if row.Clusters == n {
			return row, nil
		}
	}
	return SizingRow{}, fmt.Errorf("results.json's fleet section measured no fleet of %d clusters", n)
}

// sizingTable renders Sizing as the documentation's table.
func sizingTable(r *Results) ([]string, error) {
	rows, err := Sizing(r)
	if err != nil {
		return nil, err
	}
	out := []string{"",
		"| clusters | streams | changes/s | ctrl measured: cores, RSS | ctrl replicas | ctrl CPU request | ctrl memory request / limit | MariaDB statements/s measured |",
		"|---|---|---|---|---|---|---|---|"}
	for _, s := range rows {
		out = append(out, fmt.Sprintf("| %s | %s | %s | %s cores, %s MiB | %d | %s | %s / %s | %s |",
			thousands(strconv.Itoa(s.Clusters)), Format(s.Streams), Format(s.Rate), Format(s.CtrlCores), Format(s.CtrlRSSMiB),
			s.Replicas, s.CPURequest(), s.MemoryRequest(), s.MemoryLimit(), Format(s.Statements)))
	}
	return append(out, ""), nil
}
