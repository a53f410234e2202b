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
}

// String is "Service.name", the name AfterStep receives.
func (s Step) String() string { return s.Service + "." + s.Name }

var (
	stepsMu sync.Mutex
	steps   []Step
)

// newStep declares a step; its name is also the Run's name in Restate's
// journal. Declaring one twice is a programming error.
func newStep(service, name string) Step {
	stepsMu.Lock()
	defer stepsMu.Unlock()
	s := Step{Service: service, Name: name}
	if slices.Contains(steps, s) {
		panic(fmt.Sprintf("workflows: step %s declared twice", s))
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

// runStep is restate.Run for step s: named, with the test hook after a
// body that succeeded (see Hooks.AfterStep).
func runStep[T any](ctx restate.Context, hooks Hooks, s Step, fn func(restate.RunContext) (T, error), opts ...restate.RunOption) (T, error) {
	opts = append([]restate.RunOption{restate.WithName(s.Name)}, opts...)
	return restate.Run(ctx, func(rc restate.RunContext) (T, error) {
		sc := stepContext{RunContext: rc, step: s}
		v, err := fn(sc)
		if err == nil {
			err = hooks.after(sc, s.String())
		}
		return v, err
	}, opts...)
}
