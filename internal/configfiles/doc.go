// Package configfiles lists the files a configuration path stands for, as
// the kubelet reads --image-credential-provider-config: a file is itself;
// a directory is its *.json, *.yaml and *.yml files (not subdirectories),
// in lexicographic order, and must hold at least one. Credential provider
// and image policy configurations are both read this way.
package configfiles
