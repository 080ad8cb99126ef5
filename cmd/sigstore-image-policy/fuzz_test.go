package main

import (
	"encoding/json"
	"testing"
)

// FuzzLegacySignature: a cosign signature layer is the registry's input;
// whatever its payload and annotations hold, reading it returns an entity
// or an error, never a panic, and only a JSON payload is accepted.
func FuzzLegacySignature(f *testing.F) {
	const digest = "sha256:2445c851b9e9caaf3b1828fc3e59e54aa789849da52cc4422e1d10a6d44ffb36"
	f.Add([]byte(`{"critical":{"identity":{"docker-reference":"r.test/app"},"image":{"docker-manifest-digest":"`+digest+`"},"type":"cosign container image signature"},"optional":null}`),
		"MEUCIQ==", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
		`{"SignedEntryTimestamp":"MEUC","Payload":{"body":"e30=","integratedTime":1,"logIndex":2,"logID":"c0d2"}}`, `{"SignedRFC3161Timestamp":"MIIB"}`, false)
	f.Add([]byte(`{"critical":{"image":{"docker-manifest-digest":"sha256:00"},"type":"x"}}`), "", "", "{", "[]", true)
	f.Fuzz(func(t *testing.T, payload []byte, sig, cert, rekorBundle, timestamp string, key bool) {
		c := &candidate{payload: payload, annotations: map[string]string{
			annotationSignature: sig, annotationCertificate: cert, annotationBundle: rekorBundle, annotationTimestamp: timestamp,
		}}
		if e, err := newLegacyEntity(c, key); err == nil {
			e.HasInclusionPromise()
		}
		if err := checkPayload(payload, digest); err == nil && !json.Valid(payload) {
			t.Fatalf("accepted a payload that is not JSON: %q", payload)
		}
	})
}
