package ensure

import "github.com/cri-image-proxy/cri-image-proxy/ensure/records"

// The records' vocabulary, as the guard's API speaks it; the database
// itself is package records.
type (
	// Record is the kubelet's ImagePulledRecord.
	Record = records.Record
	// Intent is a pull in flight.
	Intent = records.Intent
	// Credential is who pulled an image.
	Credential = records.Credential
	// ServiceAccount is a service account's coordinates (KEP-4412).
	ServiceAccount = records.ServiceAccount
	// SecretRef is a pull secret's coordinates.
	SecretRef = records.SecretRef
	// Auth is a pull's credential, as hashed.
	Auth = records.Auth
	// ImageLayers is what the database knows of an image's layers.
	ImageLayers = records.ImageLayers
)

// ErrNotFound is returned for an image ID without a record.
var ErrNotFound = records.ErrNotFound
