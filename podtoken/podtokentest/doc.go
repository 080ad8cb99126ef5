// Package podtokentest adapts client-go's clientsets (the fake one, in
// tests) to podtoken.API, so that unit tests of podtoken and its users
// drive a podtoken.Source through k8s.io/client-go/kubernetes/fake.
//
// It is for tests only: the daemon does not link the generated clientset
// (see podtoken.NewAPI).
package podtokentest
