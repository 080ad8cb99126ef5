package decision_test

import (
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/cri-image-proxy/cri-image-proxy/ensure/decision"
)

func TestAMaxAgeIsTheFirstMatchingPatternsElseTheDefault(t *testing.T) {
	t.Parallel()
	e := &decision.Expiry{Default: time.Hour, ByRepository: []decision.RepositoryAge{
		{Pattern: "registry.test/team-a", MaxAge: time.Minute},
		{Pattern: "*.example.com", MaxAge: 2 * time.Minute},
		{Pattern: "registry.test", MaxAge: 3 * time.Minute},
	}}
	for _, tc := range []struct {
		name   string
		expiry *decision.Expiry
		repo   string
		want   time.Duration
	}{
		{"a repository under the first pattern gets its age", e, "registry.test/team-a/app", time.Minute},
		{"the first pattern that matches wins over a later one", e, "registry.test/team-a", time.Minute},
		{"a host glob matches a subdomain's repositories", e, "eu.example.com/app", 2 * time.Minute},
		{"another repository of a matching host gets the host's age", e, "registry.test/team-b/app", 3 * time.Minute},
		{"a repository no pattern matches gets the default", e, "docker.io/library/nginx", time.Hour},
		{"no expiry is no age", nil, "registry.test/team-a/app", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.expiry.MaxAge(tc.repo); got != tc.want {
				t.Errorf("MaxAge(%q) = %s, want %s", tc.repo, got, tc.want)
			}
		})
	}
}

func TestExpiryValidate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		expiry decision.Expiry
		want   string
	}{
		{"a negative age is refused", decision.Expiry{Default: -time.Second}, "maxRecordAge"},
		{"a pattern whose host glob is malformed is refused", decision.Expiry{ByRepository: []decision.RepositoryAge{{Pattern: "reg[istry.test/team-a", MaxAge: time.Hour}}}, "pattern"},
		{"a pattern without an age is refused", decision.Expiry{ByRepository: []decision.RepositoryAge{{Pattern: "registry.test/*"}}}, "maxAge"},
		{"a default and a pattern are fine", decision.Expiry{Default: time.Hour, ByRepository: []decision.RepositoryAge{{Pattern: "*.example.com/secret", MaxAge: time.Minute}}}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs := tc.expiry.Validate(field.NewPath("ensureSecretPulledImages"))
			if got := errs.ToAggregate(); (tc.want == "") != (got == nil) || (got != nil && !strings.Contains(got.Error(), tc.want)) {
				t.Errorf("got %v, want an error naming %q", got, tc.want)
			}
		})
	}
}
