// Package config is the versioned configuration file of cri-image-proxy
// serve (apiVersion config.cri-image-proxy.io/v1alpha1, kind
// ProxyConfiguration), shaped like a Kubernetes component config.
//
// Load decodes strictly (an unknown or misspelt field is an error), fills
// defaults and validates; every error names the file, the field path and
// the problem. Flags given on the command line override the file.
//
// The files by role: config.go the types, section by section;
// defaults.go the defaults, filled per section; load.go reading and
// decoding, and the deprecated fields; validate.go the checks.
package config
