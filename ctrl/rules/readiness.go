package rules

import (
	"fmt"
	"strings"

	"krane.dev/ctrl/actual"
	"krane.dev/ctrl/store"
)

// Outcome results.
const (
	ResultReady   = "ready"
	ResultFailed  = "failed"
	ResultStopped = "stopped"
	// ResultGone: the deployment left the deploy on its own terms (it was
	// not pending when the workflow started, say); the workflow writes
	// nothing more.
	ResultGone = "gone"
)

// Outcome is how a deploy's wait ends: ready, failed (Message says which
// region, which instances, why) or stopped. Result "" means undecided;
// Message then says what is still missing.
type Outcome struct {
	Result  string `json:"result,omitempty"`
	Message string `json:"message,omitempty"`
	// Status is the deployment's status when Result is gone: what the
	// workflow found it at, and reports.
	Status string `json:"status,omitempty"`
}

// Decided reports whether the outcome ends the wait.
func (o Outcome) Decided() bool { return o.Result != "" }

// maxListed bounds how many instances one region's message names.
const maxListed = 3

// Evaluate decides a deploy from its regions (store.RegionStates), where
// the clusters that count are those of the aggregation rule (ctrl/actual:
// registered, heartbeating within its live window, serving deployments);
// the reports of other clusters decide nothing:
//   - failed when a counted cluster reported a failed instance (its pod,
//     reason and message are named) or could not apply the deployment for
//     good (the cluster's own message, with the version it refused);
//   - ready when in every region that should run it at least one cluster
//     counts, and every counted cluster reported the region's current
//     version with at least the desired number of running instances;
//   - otherwise undecided, with what each region still lacks.
func Evaluate(regions []store.RegionState) Outcome {
	var failures, waiting []string
	active := 0
	for _, r := range regions {
		if r.DesiredStatus != "running" || r.DesiredReplicas <= 0 {
			continue
		}
		active++
		counted := map[string]bool{}
		for _, id := range r.Actual.Counted {
			counted[id] = true
		}
		var bad []string
		for _, e := range r.ApplyErrors {
			if e.Permanent && counted[e.ClusterID] {
				bad = append(bad, ApplyErrorText(e))
			}
		}
		if len(bad) > 0 {
			// The cluster refused the object: say only why.
			failures = append(failures, fmt.Sprintf("region %s: %s", r.Region, strings.Join(bad, "; ")))
			continue
		}
		if len(counted) == 0 {
			waiting = append(waiting, fmt.Sprintf("region %s: no live cluster serves deployments (a cluster counts while its last heartbeat is at most %s old)",
				r.Region, actual.LiveWindow))
			continue
		}
		byCluster := r.CountedInstances()
		for _, id := range r.Actual.Counted {
			head := fmt.Sprintf("region %s", r.Region)
			if len(r.Actual.Counted) > 1 {
				head += ", cluster " + id
			}
			var failed, pending []string
			running := int32(0)
			for _, in := range byCluster[id] {
				switch in.Status {
				case "failed":
					failed = append(failed, instanceText(in))
				case "pending":
					pending = append(pending, instanceText(in))
				case "running":
					running++
				}
			}
			head += fmt.Sprintf(": %d/%d running", running, r.DesiredReplicas)
			rep, reported := r.Actual.Report(id)
			switch {
			case len(failed) > 0:
				failures = append(failures, head+": "+listed(failed))
			case running < r.DesiredReplicas || !reported || rep.Version < r.Version:
				detail := "no instance reported yet"
				switch {
				case len(pending) > 0:
					detail = listed(pending)
				case running >= r.DesiredReplicas:
					detail = fmt.Sprintf("version %d not reported yet", r.Version)
				}
				for _, e := range r.ApplyErrors { // retryable: the cluster keeps trying
					if e.ClusterID == id {
						detail += "; retrying: " + ApplyErrorText(e)
					}
				}
				waiting = append(waiting, head+" ("+detail+")")
			}
		}
	}
	switch {
	case len(failures) > 0:
		return Outcome{Result: ResultFailed, Message: strings.Join(failures, "; ")}
	case active == 0:
		return Outcome{Message: "no region is set to run the deployment"}
	case len(waiting) == 0:
		return Outcome{Result: ResultReady}
	}
	return Outcome{Message: strings.Join(waiting, "; ")}
}

// instanceText: "pod web-0 ImagePullBackOff: Back-off pulling image ...".
func instanceText(in store.Instance) string {
	s := "pod " + in.K8sName
	switch {
	case in.Reason != "" && in.Message != "":
		s += " " + in.Reason + ": " + in.Message
	case in.Reason != "":
		s += " " + in.Reason
	case in.Message != "":
		s += " " + in.Status + ": " + in.Message
	default:
		s += " " + in.Status
	}
	return s
}

// ApplyErrorText words an apply error for a message: "image: not a valid reference (cluster us-1 could not
// apply version 42)".
func ApplyErrorText(e store.ApplyError) string {
	msg := e.Message
	if e.Field != "" && !strings.HasPrefix(msg, e.Field) {
		msg = e.Field + ": " + msg
	}
	return fmt.Sprintf("%s (cluster %s could not apply version %d)", msg, e.ClusterID, e.Version)
}

func listed(items []string) string {
	if len(items) <= maxListed {
		return strings.Join(items, ", ")
	}
	return strings.Join(items[:maxListed], ", ") + fmt.Sprintf(" and %d more", len(items)-maxListed)
}
