// Package layerprivacy decides which layers of the node are private.
//
// Layers are where the runtime shares content between images: containerd
// reuses a layer's snapshot whenever the chain ID computed from an image
// config's diff_ids exists, without fetching or checking a blob. So a
// registry that names, in a config of its own, the diff_ids of another
// tenant's private image has the runtime build its image from that
// tenant's layers. The registry is trusted for its own repositories (a
// layer it supplied, or vouched for in a verified pull before); for a
// layer the node holds from elsewhere only its bytes prove anything.
//
// A layer is private on the node when an image holding it has a record
// that restricts some repository (pulled with a secret or a service
// account, or with no verified credential) or a pull of such an image is
// in flight, and no public image holds it: public is an image the proxy
// saw on the node, with no record, before the first private one holding
// the layer (preloaded), an image with preloaded names (on the node, free,
// before its first recorded pull: it still is, by those names and by ID),
// or an image pulled node-wide (anonymously, or with node credentials)
// whose repository vouched for the layer. A record made node-wide before
// this check existed makes nothing public. An image that came around the
// proxy holding a private layer gets no preloaded names from a later pull
// of it: it was never free.
//
// A pull of an image as repo proves by its bytes each private layer that
// repo has not vouched for (ensure's Verify, asking ToProve once the
// runtime pulled, in case the node changed meanwhile), and its record keeps repo's word for
// every layer. An image with no record whose layers include a private one
// it did not hold before that layer became private came around the proxy
// (CameWithPrivateLayers; ensure's arrivedAroundTheProxy): it is tracked as pulled with no verified
// credential, so every pod must pull it through the proxy.
//
// The package holds the state these decisions need beside the records:
// the pulls in flight and their layers (Flights), the images tracked on
// the node whose layers the runtime did not say (Unknown), and whether a
// look at the node's images has succeeded (Observation). It reads the
// records and asks the runtime through the small Store and Runtime
// interfaces; ensure writes what it decides.
package layerprivacy
