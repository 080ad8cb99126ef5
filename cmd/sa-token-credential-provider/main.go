package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.audience, "audience", "", "the audience the token must carry")
	flag.StringVar(&o.credentials, "credentials", "", "file of user:password lines")
	flag.StringVar(&o.annotation, "annotation", "registry.test/user", "the service account annotation naming the user")
	flag.StringVar(&o.log, "log", "", "append the claims of each request to this file (JSON lines)")
	o.podUsers = map[string]string{}
	flag.Func("user-for-pod", "POD=USER: the token of the pod named POD gets USER's credentials, whatever the annotation says (repeatable)", func(v string) error {
		pod, user, ok := strings.Cut(v, "=")
		if !ok || pod == "" || user == "" {
			return fmt.Errorf("want POD=USER, got %q", v)
		}
		o.podUsers[pod] = user
		return nil
	})
	flag.Func("cache-duration", "answer this cacheDuration (e.g. 0s: not cached); unset, the provider's defaultCacheDuration applies", func(v string) error {
		d, err := time.ParseDuration(v)
		if err != nil {
			return err
		}
		o.cacheDuration = &d
		return nil
	})
	forTests := flag.Bool("for-tests-only", false, "required: say that this is a test run (the plugin does not verify token signatures; never deploy it)")
	flag.Parse()
	if !*forTests {
		// It hands registry credentials to any well-formed token, forged or
		// not: on a real node that is a credential for anyone.
		fmt.Fprintln(os.Stderr, "sa-token-credential-provider: refusing to run: this is a test plugin that does not verify token signatures; never deploy it (tests pass --for-tests-only)")
		os.Exit(2)
	}
	o.now = time.Now
	if err := run(os.Stdin, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "sa-token-credential-provider:", err)
		os.Exit(1)
	}
}
