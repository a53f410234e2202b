package workflows

import (
	"context"
	"fmt"
	"slices"
	"sync"

	restate "github.com/restatedev/sdk-go"
)

// Step names one restate.Run step of a service. Every Run of ctrl's
// services goes through runStep with a Step declared at package level by
// newStep, so Steps lists them all: the crash-point tests inject a fault at
// each one without a list of their own, and a step added later is covered
// (or reported as not covered) without editing them.
type Step struct {
	Service string
	Name    string
	// WritesNothing: the body commits nothing to ctrl's database (it
	// reads, asks the clock, or talks to another system). Declared with
	// newReadStep; the crash-point suite fails a step declared so that
	// commits, and a step not declared so that never commits, so the
	// list stays true. An ambiguous commit cannot happen in such a step,
	// and a database comparison after its re-run proves nothing: the
	// suite checks its result instead.
	WritesNothing bool
}

// String is "Service.name", the name AfterStep receives.
func (s Step) String() string { return s.Service + "." + s.Name }

var (
	stepsMu sync.Mutex
	steps   []Step
)

// newStep declares a step that commits to ctrl's database; its name is
// also the Run's name in Restate's journal. Declaring one twice is a
// programming error.
func newStep(service, name string) Step {
	return declareStep(Step{Service: service, Name: name})
}

// newReadStep declares a step that commits nothing to ctrl's database
// (see Step.WritesNothing).
func newReadStep(service, name string) Step {
	return declareStep(Step{Service: service, Name: name, WritesNothing: true})
}

func declareStep(s Step) Step {
	stepsMu.Lock()
	defer stepsMu.Unlock()
	for _, d := range steps {
		if d.String() == s.String() {
			panic(fmt.Sprintf("workflows: step %s declared twice", s))
		}
	}
	steps = append(steps, s)
	return s
}

// Steps lists every restate.Run step of ctrl's services, in declaration
// order.
func Steps() []Step {
	stepsMu.Lock()
	defer stepsMu.Unlock()
	return slices.Clone(steps)
}

// stepKey is the context key under which a step's body finds its Step.
type stepKey struct{}

// stepContext is the RunContext a step's body runs with: the SDK's, plus
// the step (StepOf), so what the body calls (the store's test hooks) can
// tell which step it runs in.
type stepContext struct {
	restate.RunContext
	step Step
}

func (c stepContext) Value(key any) any {
	if _, ok := key.(stepKey); ok {
		return c.step
	}
	return c.RunContext.Value(key)
}

// StepOf returns the step whose body ctx belongs to (a RunContext of
// runStep, or a context derived from one).
func StepOf(ctx context.Context) (Step, bool) {
	s, ok := ctx.Value(stepKey{}).(Step)
	return s, ok
}

// runStep is restate.Run for step s: named, with the test hooks after a
// body that succeeded (see Hooks.AfterStep and Hooks.StepResult).
func runStep[T any](ctx restate.Context, hooks Hooks, s Step, fn func(restate.RunContext) (T, error), opts ...restate.RunOption) (T, error) {
	opts = append([]restate.RunOption{restate.WithName(s.Name)}, opts...)
	return restate.Run(ctx, func(rc restate.RunContext) (T, error) {
		sc := stepContext{RunContext: rc, step: s}
		v, err := fn(sc)
		if err == nil {
			err = hooks.after(sc, s.String())
		}
		if err == nil && hooks.StepResult != nil {
			hooks.StepResult(sc, s.String(), v)
		}
		return v, err
	}, opts...)
}
