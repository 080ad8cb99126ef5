package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// A measurement is one part of the bench's report: a scenario, whose arms
// are measured side by side and make rows of the main table (scenarioOf),
// or a measurement of its own that adds targets and a section (the Go
// runtime settings, the fleet, pod start).
type measurement struct {
	// name is what -only matches: a measurement runs when its name
	// contains -only's value.
	name string
	// needs are the parts of the environment it uses beyond the base
	// (containerd, the pass-through proxy, the bare server).
	needs []part
	run   func(e *benchEnv, rep *report) error
}

// measurements is every measurement of the bench, in the order they run
// and are reported. A new one goes in the list of its file, or here.
func measurements(o options) []measurement {
	ms := slices.Concat(
		passThroughScenarios(),               // scenarios.go
		injectionScenarios(),                 // inject.go
		ensureScenarios(),                    // ensure.go
		[]measurement{registryCheckScenario}, // registrycheck.go
		[]measurement{layerProofScenario},    // layerproof.go
		pullCostScenarios(),                  // pullcost.go
		realisticScenarios(),                 // realistic.go
		policyScenarios(),                    // imagepolicy.go
		[]measurement{guardCostMeasurement},  // imagepolicy.go
		tokenScenarios(),                     // token.go
		[]measurement{
			listImagesScenario, // scenarios.go
			ensureMemory,       // ensure.go
			goRuntimeSettings,  // goruntime.go
		},
	)
	if o.fleetNodes > 0 {
		ms = append(ms, fleetMeasurement(o.fleetNodes)) // fleet.go
	}
	if o.pods > 0 {
		ms = append(ms, podStartMeasurement(o.pods)) // podstart.go
	}
	if o.stormRounds > 0 {
		ms = append(ms, stormMeasurement(o.stormRounds)) // storm.go
	}
	return ms
}

// A part is a piece of the environment that measurements share: set up
// once, before the measurements run, when one of them needs it.
type part int

const (
	// injectionProxies: two proxies with the reference plugin, its answers
	// cached and not (inject.go); it builds the plugin.
	injectionProxies part = iota
	// ensureProxies: two proxies enforcing KEP-2535 on 100 and 100,000
	// records (ensure.go).
	ensureProxies
	// kubeAPI: kube-apiserver and etcd, and two proxies with the token
	// plugin (token.go).
	kubeAPI
	// policyProxy: a proxy enforcing ensure with an image policy, the
	// reference plugin and signed images (imagepolicy.go); after
	// ensureProxies, whose public image it signs.
	policyProxy
	// farRegistryPart: the authenticated registry 20 ms away, with images
	// of a realistic size, pulled as A through the ensure-100 proxy
	// (realistic.go); after ensureProxies.
	farRegistryPart
)

// setUpPart sets up a part; they are set up in the order of the constants.
var setUpPart = map[part]func(*benchEnv) error{
	injectionProxies: (*benchEnv).setUpInjection,
	ensureProxies:    (*benchEnv).setUpEnsure,
	kubeAPI:          (*benchEnv).setUpToken,
	policyProxy:      (*benchEnv).setUpPolicy,
	farRegistryPart:  (*benchEnv).setUpFar,
}

// selectMeasurements keeps those whose name contains only ("": all), and
// returns the parts they need, in the order to set them up.
func selectMeasurements(all []measurement, only string) ([]measurement, []part, error) {
	var ms []measurement
	var parts []part
	for _, m := range all {
		if strings.Contains(m.name, only) {
			ms = append(ms, m)
			parts = append(parts, m.needs...)
		}
	}
	if len(ms) == 0 {
		var names []string
		for _, m := range all {
			names = append(names, m.name)
		}
		return nil, nil, fmt.Errorf("-only %q is in no measurement's name; they are:\n  %s", only, strings.Join(names, "\n  "))
	}
	slices.Sort(parts)
	return ms, slices.Compact(parts), nil
}

// report is what the measurements found, in the order they ran.
type report struct {
	results  []*result     // the scenarios'
	extra    []extraTarget // targets measured outside the scenarios
	sections []string      // the other measurements' own sections
}

// scenarioOf is a scenario as a measurement: build makes it once the
// environment is set up; it is measured in rounds (benchEnv.measure), with
// the proxy's CPU profile captured when -profile names it.
func scenarioOf(name string, needs []part, build func(e *benchEnv) scenario) measurement {
	return measurement{name: name, needs: needs, run: func(e *benchEnv, rep *report) error {
		sc := build(e)
		sc.name = name
		e.logf("scenario %s (%d rounds)", sc.name, e.opts.rounds)
		stopProfile := func() {}
		if e.opts.profile != "" && sc.name == e.opts.profile {
			os.MkdirAll(e.opts.out, 0o755)
			stopProfile = e.profileProxy(sc, filepath.Join(e.opts.out, "proxy-cpu.pprof"), e.duration(sc))
		}
		rep.results = append(rep.results, e.measure(sc))
		stopProfile()
		return nil
	}}
}
