package main

import (
	"flag"
	"fmt"
	"os"
	"time"
)

func main() {
	var o options
	flag.StringVar(&o.audience, "audience", "", "the audience the token must carry")
	flag.StringVar(&o.credentials, "credentials", "", "file of user:password lines")
	flag.StringVar(&o.annotation, "annotation", "registry.test/user", "the service account annotation naming the user")
	flag.StringVar(&o.log, "log", "", "append the claims of each request to this file (JSON lines)")
	flag.Parse()
	o.now = time.Now
	if err := run(os.Stdin, os.Stdout, o); err != nil {
		fmt.Fprintln(os.Stderr, "sa-token-credential-provider:", err)
		os.Exit(1)
	}
}
