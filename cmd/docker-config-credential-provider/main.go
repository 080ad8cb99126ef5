package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	path := flag.String("docker-config", "/etc/cri-image-proxy/docker-config.json", "the docker config.json with the credentials")
	flag.Parse()
	if err := run(os.Stdin, os.Stdout, *path); err != nil {
		fmt.Fprintln(os.Stderr, "docker-config-credential-provider:", err)
		os.Exit(1)
	}
}
