// Command genmethods writes criproxy's methods_gen.go: one typed Method
// value per unary CRI v1 method, read off the cri-api's own service
// descriptions, so that intercepting any of them needs no edit in
// criproxy and a hook of the wrong type does not compile.
//
//	go generate ./criproxy
package main
