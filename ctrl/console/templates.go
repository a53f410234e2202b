package console

import (
	"fmt"
	"html/template"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	clusterv1 "krane.dev/proto/krane/cluster/v1"
	ctrlv1 "krane.dev/proto/krane/ctrl/v1"
)

// pageNames are the pages; each is templates/<name>.html on the layout.
var pageNames = []string{"login", "message", "confirm", "fleet", "deployments", "deployment", "sentinels", "rollouts", "resources"}

func parseTemplates() (map[string]*template.Template, error) {
	base, err := template.New("").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse templates: %w", err)
	}
	out := map[string]*template.Template{}
	for _, name := range pageNames {
		t, err := template.Must(base.Clone()).ParseFS(templateFS, "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parse template %s: %w", name, err)
		}
		out[name] = t
	}
	return out, nil
}

var funcs = template.FuncMap{
	"ago":       ago,
	"clock":     clock,
	"ts":        func(t *timestamppb.Timestamp) time.Time { return tsTime(t) },
	"depStatus": statusName,
	"health":    clusterv1.Health.Word,
	"u64": func(p *uint64) string {
		if p == nil {
			return ""
		}
		return fmt.Sprint(*p)
	},
	"i32": func(p *int32) string {
		if p == nil {
			return ""
		}
		return fmt.Sprint(*p)
	},
	// secs is a lag in seconds as a short duration ("" when unset).
	"secs": func(p *float64) string {
		if p == nil {
			return ""
		}
		return (time.Duration(*p * float64(time.Second))).Round(100 * time.Millisecond).String()
	},
	"join": strings.Join,
	"pct":  func(f float64) string { return fmt.Sprintf("%.3f", f) },
	"addf": func(a, b float64) float64 { return a + b },
	"ready": func(d *ctrlv1.DeploymentInfo) bool {
		return d.GetStatus() == ctrlv1.DeploymentStatus_DEPLOYMENT_STATUS_READY
	},
	// depActions is what the dep-actions template needs: a deployment's
	// promote and roll-back forms.
	"depActions": func(d *ctrlv1.DeploymentInfo, csrf, back string) depActions {
		return depActions{D: d, CSRF: csrf, Back: back}
	},
}

type depActions struct {
	D          *ctrlv1.DeploymentInfo
	CSRF, Back string
}

func tsTime(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

// ago says how long ago t was, coarsely ("never" for the zero time).
func ago(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := time.Since(t)
	switch {
	case d < 0:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh ago", int(d.Hours()))
	}
	return fmt.Sprintf("%dd ago", int(d.Hours()/24))
}

// clock is a time in UTC, to the second ("" for the zero time).
func clock(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// statusName is a deployment status as a word: ready, failed, ...
func statusName(s ctrlv1.DeploymentStatus) string {
	name := strings.ToLower(strings.TrimPrefix(s.String(), "DEPLOYMENT_STATUS_"))
	if name == "unspecified" {
		return "unknown"
	}
	return name
}
