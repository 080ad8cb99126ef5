// Package pullcred names the credential a pull succeeded with, as
// credential injection tells the code that records it (ensure, bake): a
// credential provider plugin's, node-wide or for a pod's service account,
// or none of the plugins' (the request's own, or anonymous). It is a
// vocabulary, and imports nothing of the project. Tries is the other
// half of that exchange: the credentials a pull goes with, in order, as a
// sequence the code that pulls loops over.
package pullcred
