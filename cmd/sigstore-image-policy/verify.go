package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/sigstore/sigstore-go/pkg/bundle"
	"github.com/sigstore/sigstore-go/pkg/tlog"
	"github.com/sigstore/sigstore-go/pkg/verify"
	"github.com/sigstore/sigstore/pkg/cryptoutils"
)

// verifyCandidate checks one found signature against one authority, for
// the image's digest; nil means the signature is the authority's and
// signs this image.
func (a *authority) verifyCandidate(c *candidate, digest string) error {
	if c.err != nil {
		return fmt.Errorf("unreadable: %w", c.err)
	}
	if c.bundle != nil {
		return a.verifyBundle(c.bundle, digest)
	}
	return a.verifyLegacy(c, digest)
}

// policyOptions is what the authority requires of the signer.
func (a *authority) policyOption() verify.PolicyOption {
	if a.key {
		return verify.WithKey()
	}
	return func(pc *verify.PolicyConfig) error {
		for _, id := range a.identities {
			if err := verify.WithCertificateIdentity(id)(pc); err != nil {
				return err
			}
		}
		return nil
	}
}

// verifyBundle verifies a cosign v3 signature: a sigstore bundle whose
// DSSE envelope holds an in-toto statement of predicate type
// https://sigstore.dev/cosign/sign/v1 with the image's digest as subject.
func (a *authority) verifyBundle(data []byte, digest string) error {
	var b bundle.Bundle
	if err := b.UnmarshalJSON(data); err != nil {
		return fmt.Errorf("not a sigstore bundle: %w", err)
	}
	if b.GetDsseEnvelope() == nil {
		return errors.New("a message signature bundle, not an image signature (a DSSE statement)")
	}
	alg, hexDigest, _ := strings.Cut(digest, ":")
	raw, err := hex.DecodeString(hexDigest)
	if err != nil || alg != "sha256" {
		return fmt.Errorf("digest %q is not sha256", digest)
	}
	res, err := a.verifier.Verify(&b, verify.NewPolicy(verify.WithArtifactDigest(alg, raw), a.policyOption()))
	if err != nil {
		return err
	}
	if res.Statement == nil || res.Statement.GetPredicateType() != signPredicateType {
		pt := ""
		if res.Statement != nil {
			pt = res.Statement.GetPredicateType()
		}
		return fmt.Errorf("an attestation of predicate type %q, not an image signature (%s)", pt, signPredicateType)
	}
	return nil
}

// verifyLegacy verifies a cosign simple signing signature: the layer's
// payload, signed as a message, with the signature, certificate, Rekor
// bundle and timestamp from the layer's annotations.
func (a *authority) verifyLegacy(c *candidate, digest string) error {
	e, err := newLegacyEntity(c, a.key)
	if err != nil {
		return err
	}
	if _, err := a.verifier.Verify(e, verify.NewPolicy(verify.WithArtifact(bytes.NewReader(c.payload)), a.policyOption())); err != nil {
		return err
	}
	return checkPayload(c.payload, digest)
}

// legacyEntity is a cosign simple signing signature as sigstore-go's
// SignedEntity.
type legacyEntity struct {
	verify.BaseSignedEntity
	verification verify.VerificationContent
	signature    *bundle.MessageSignature
	entries      []*tlog.Entry
	timestamps   [][]byte
}

// cosignBundle is the annotation dev.sigstore.cosign/bundle: a Rekor
// entry with its signed entry timestamp.
type cosignBundle struct {
	SignedEntryTimestamp []byte `json:"SignedEntryTimestamp"`
	Payload              struct {
		Body           string `json:"body"`
		IntegratedTime int64  `json:"integratedTime"`
		LogIndex       int64  `json:"logIndex"`
		LogID          string `json:"logID"`
	} `json:"Payload"`
}

func newLegacyEntity(c *candidate, key bool) (*legacyEntity, error) {
	sig, err := base64.StdEncoding.DecodeString(c.annotations[annotationSignature])
	if err != nil || len(sig) == 0 {
		return nil, errors.New("no signature annotation")
	}
	sum := sha256.Sum256(c.payload)
	e := &legacyEntity{signature: bundle.NewMessageSignature(sum[:], "SHA2_256", sig)}
	if key {
		// The key is the authority's: a certificate in the signature does
		// not choose it.
		e.verification = &bundle.PublicKey{}
	} else {
		certPEM := c.annotations[annotationCertificate]
		if certPEM == "" {
			return nil, errors.New("no certificate: signed with a key, not keyless")
		}
		certs, err := cryptoutils.UnmarshalCertificatesFromPEM([]byte(certPEM))
		if err != nil || len(certs) == 0 {
			return nil, errors.New("the certificate annotation holds no certificate")
		}
		e.verification = bundle.NewCertificate(certs[0])
	}
	if s := c.annotations[annotationBundle]; s != "" {
		var cb cosignBundle
		if err := json.Unmarshal([]byte(s), &cb); err != nil {
			return nil, errors.New("the Rekor bundle annotation is not JSON")
		}
		body, err := base64.StdEncoding.DecodeString(cb.Payload.Body)
		if err != nil {
			return nil, errors.New("the Rekor bundle's body is not base64")
		}
		logID, err := hex.DecodeString(cb.Payload.LogID)
		if err != nil {
			return nil, errors.New("the Rekor bundle's logID is not hex")
		}
		//lint:ignore SA1019 cosign's legacy bundle is a Rekor v1 entry, which NewEntry parses; its replacement, NewTlogEntry, wants the kind and version this annotation does not carry and tries the body as Rekor v2 first
		entry, err := tlog.NewEntry(body, cb.Payload.IntegratedTime, cb.Payload.LogIndex, logID, cb.SignedEntryTimestamp, nil)
		if err != nil {
			return nil, fmt.Errorf("the Rekor bundle's entry: %w", err)
		}
		e.entries = append(e.entries, entry)
	}
	if s := c.annotations[annotationTimestamp]; s != "" {
		var ts struct {
			SignedRFC3161Timestamp []byte `json:"SignedRFC3161Timestamp"`
		}
		if err := json.Unmarshal([]byte(s), &ts); err != nil {
			return nil, errors.New("the timestamp annotation is not JSON")
		}
		e.timestamps = append(e.timestamps, ts.SignedRFC3161Timestamp)
	}
	return e, nil
}

func (e *legacyEntity) VerificationContent() (verify.VerificationContent, error) {
	return e.verification, nil
}
func (e *legacyEntity) SignatureContent() (verify.SignatureContent, error) { return e.signature, nil }
func (e *legacyEntity) TlogEntries() ([]*tlog.Entry, error)                { return e.entries, nil }
func (e *legacyEntity) Timestamps() ([][]byte, error)                      { return e.timestamps, nil }

// Version enables sigstore-go's compatibility with the hash and key
// combinations older cosign used.
func (e *legacyEntity) Version() (string, error) { return "v0.1", nil }

func (e *legacyEntity) HasInclusionPromise() bool {
	for _, t := range e.entries {
		if t.HasInclusionPromise() {
			return true
		}
	}
	return false
}
