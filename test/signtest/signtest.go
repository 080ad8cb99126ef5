package signtest

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/types"
	protobundle "github.com/sigstore/protobuf-specs/gen/pb-go/bundle/v1"
	protocommon "github.com/sigstore/protobuf-specs/gen/pb-go/common/v1"
	protodsse "github.com/sigstore/protobuf-specs/gen/pb-go/dsse"
	protorekor "github.com/sigstore/protobuf-specs/gen/pb-go/rekor/v1"
	"github.com/sigstore/sigstore-go/pkg/root"
	"github.com/sigstore/sigstore-go/pkg/testing/ca"
	"github.com/sigstore/sigstore-go/pkg/tlog"
	"google.golang.org/protobuf/encoding/protojson"
)

// The cosign formats, as cosign writes them.
const (
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	SimpleSigningType      = "cosign container image signature"
	BundleMediaType        = "application/vnd.dev.sigstore.bundle.v0.3+json"
	SignPredicateType      = "https://sigstore.dev/cosign/sign/v1"
	InTotoPayloadType      = "application/vnd.in-toto+json"
	emptyMediaType         = "application/vnd.oci.empty.v1+json"

	AnnotationSignature   = "dev.cosignproject.cosign/signature"
	AnnotationCertificate = "dev.sigstore.cosign/certificate"
	AnnotationChain       = "dev.sigstore.cosign/chain"
	AnnotationBundle      = "dev.sigstore.cosign/bundle"
	AnnotationTimestamp   = "dev.sigstore.cosign/rfc3161timestamp"
)

// Format is where and how a signature is stored.
type Format int

// The formats.
const (
	// TagConvention is cosign's legacy layout: <repo>:sha256-<hex>.sig.
	TagConvention Format = iota
	// Referrer is cosign v3's: a sigstore bundle as an OCI referrer.
	Referrer
)

// Options say how to reach the registry and what to sign.
type Options struct {
	Format Format
	// Auth is the registry credential; nil: anonymous.
	Auth authn.Authenticator
	// Transport carries the registry requests; nil: the default.
	Transport http.RoundTripper
	// SignedDigest, when set, is the digest the signature claims in place
	// of the image's: a valid signature of another image, attached to this
	// one.
	SignedDigest string
}

func (o Options) remote(ctx context.Context) []remote.Option {
	opts := []remote.Option{remote.WithContext(ctx)}
	if o.Auth != nil {
		opts = append(opts, remote.WithAuth(o.Auth))
	}
	if o.Transport != nil {
		opts = append(opts, remote.WithTransport(o.Transport))
	}
	return opts
}

// Key is an ECDSA P-256 signing key, as cosign generate-key-pair makes.
type Key struct{ priv *ecdsa.PrivateKey }

// NewKey generates a key.
func NewKey() (*Key, error) {
	priv, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	return &Key{priv: priv}, nil
}

// PublicKeyPEM is the public key as cosign.pub holds it.
func (k *Key) PublicKeyPEM() []byte {
	der, err := x509.MarshalPKIXPublicKey(&k.priv.PublicKey)
	if err != nil {
		panic(err) // an ECDSA P-256 key always marshals
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
}

func (k *Key) sign(message []byte) ([]byte, error) {
	sum := sha256.Sum256(message)
	return ecdsa.SignASN1(rand.Reader, k.priv, sum[:])
}

// Authority is sigstore-go's test signing authority: it issues
// short-lived certificates for an identity and issuer, logs signatures in
// a virtual Rekor and timestamps them. Its trusted root is valid for an
// hour from NewAuthority: sign within that hour.
type Authority struct{ vs *ca.VirtualSigstore }

// NewAuthority starts an authority.
func NewAuthority() (*Authority, error) {
	vs, err := ca.NewVirtualSigstore()
	if err != nil {
		return nil, err
	}
	return &Authority{vs: vs}, nil
}

// TrustedRootJSON is the authority's trusted root, as a sigstore
// trusted_root.json, for verifiers offline.
func (a *Authority) TrustedRootJSON() ([]byte, error) {
	tr, err := root.NewTrustedRoot(root.TrustedRootMediaType01, a.vs.FulcioCertificateAuthorities(), rawLogIDs(a.vs.CTLogs()), a.vs.TimestampingAuthorities(), rawLogIDs(a.vs.RekorLogs()))
	if err != nil {
		return nil, err
	}
	return tr.MarshalJSON()
}

// rawLogIDs gives each log the ID a trusted root file holds: the key ID's
// bytes. The test authority keeps their hex form as the ID, which is
// right in memory (verifiers look logs up by the hex key) but, written to
// a file and read back, would name no log.
func rawLogIDs(logs map[string]*root.TransparencyLog) map[string]*root.TransparencyLog {
	out := make(map[string]*root.TransparencyLog, len(logs))
	for k, l := range logs {
		c := *l
		if raw, err := hex.DecodeString(k); err == nil {
			c.ID = raw
		}
		out[k] = &c
	}
	return out
}

// target is the image being signed.
type target struct {
	digest name.Digest
	desc   *v1.Descriptor // the image's manifest, for a referrer's subject
	signed string         // the digest the signature claims
}

func resolve(ctx context.Context, image string, o Options) (*target, error) {
	d, err := name.NewDigest(image)
	if err != nil {
		return nil, fmt.Errorf("signtest: %q is not repository@digest: %w", image, err)
	}
	t := &target{digest: d, signed: d.DigestStr()}
	if o.SignedDigest != "" {
		t.signed = o.SignedDigest
	}
	if o.Format == Referrer {
		if t.desc, err = remote.Head(d, o.remote(ctx)...); err != nil {
			return nil, fmt.Errorf("signtest: %s: %w", image, err)
		}
	}
	return t, nil
}

// SignWithKey signs image ("registry/repo@sha256:...") with key and pushes
// the signature.
func SignWithKey(ctx context.Context, image string, key *Key, o Options) error {
	t, err := resolve(ctx, image, o)
	if err != nil {
		return err
	}
	if o.Format == Referrer {
		payload, err := statement(t)
		if err != nil {
			return err
		}
		sig, err := key.sign(pae(InTotoPayloadType, payload))
		if err != nil {
			return err
		}
		b := &protobundle.Bundle{
			MediaType: BundleMediaType,
			VerificationMaterial: &protobundle.VerificationMaterial{
				Content: &protobundle.VerificationMaterial_PublicKey{PublicKey: &protocommon.PublicKeyIdentifier{Hint: "signtest"}},
			},
			Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{
				Payload: payload, PayloadType: InTotoPayloadType, Signatures: []*protodsse.Signature{{Sig: sig}},
			}},
		}
		return pushReferrer(ctx, t, b, o)
	}
	payload := simpleSigning(t)
	sig, err := key.sign(payload)
	if err != nil {
		return err
	}
	return pushTagConvention(ctx, t, payload, map[string]string{AnnotationSignature: base64.StdEncoding.EncodeToString(sig)}, o)
}

// SignKeyless signs image as identity (a certificate's e-mail SAN) issued
// by issuer (the OIDC issuer extension), with a certificate, a Rekor entry
// and a timestamp from a, and pushes the signature.
func SignKeyless(ctx context.Context, image string, a *Authority, identity, issuer string, o Options) error {
	t, err := resolve(ctx, image, o)
	if err != nil {
		return err
	}
	// The authority dates its log entry 5 minutes on, inside the 10-minute
	// life of the certificate it issues now.
	logTime := time.Now().Add(5 * time.Minute)
	if o.Format == Referrer {
		payload, err := statement(t)
		if err != nil {
			return err
		}
		te, err := a.vs.AttestAtTime(identity, issuer, payload, logTime, true)
		if err != nil {
			return err
		}
		vc, _ := te.VerificationContent()
		sc, _ := te.SignatureContent()
		env := sc.EnvelopeContent().RawEnvelope()
		sig, err := base64.StdEncoding.DecodeString(env.Signatures[0].Sig)
		if err != nil {
			return err
		}
		tle, err := a.logEntry(te, "dsse")
		if err != nil {
			return err
		}
		tsrs, _ := te.Timestamps()
		b := &protobundle.Bundle{
			MediaType: BundleMediaType,
			VerificationMaterial: &protobundle.VerificationMaterial{
				Content:                   &protobundle.VerificationMaterial_Certificate{Certificate: &protocommon.X509Certificate{RawBytes: vc.Certificate().Raw}},
				TlogEntries:               []*protorekor.TransparencyLogEntry{tle},
				TimestampVerificationData: &protobundle.TimestampVerificationData{Rfc3161Timestamps: []*protocommon.RFC3161SignedTimestamp{{SignedTimestamp: tsrs[0]}}},
			},
			Content: &protobundle.Bundle_DsseEnvelope{DsseEnvelope: &protodsse.Envelope{
				Payload: payload, PayloadType: env.PayloadType, Signatures: []*protodsse.Signature{{Sig: sig}},
			}},
		}
		return pushReferrer(ctx, t, b, o)
	}
	payload := simpleSigning(t)
	te, err := a.vs.SignAtTime(identity, issuer, payload, logTime)
	if err != nil {
		return err
	}
	vc, _ := te.VerificationContent()
	sc, _ := te.SignatureContent()
	tle, err := a.logEntry(te, "hashedrekord")
	if err != nil {
		return err
	}
	rekorBundle, err := json.Marshal(map[string]any{
		"SignedEntryTimestamp": tle.InclusionPromise.SignedEntryTimestamp,
		"Payload": map[string]any{
			"body": base64.StdEncoding.EncodeToString(tle.CanonicalizedBody), "integratedTime": tle.IntegratedTime,
			"logIndex": tle.LogIndex, "logID": hex.EncodeToString(tle.LogId.KeyId),
		},
	})
	if err != nil {
		return err
	}
	tsrs, _ := te.Timestamps()
	timestamp, err := json.Marshal(map[string][]byte{"SignedRFC3161Timestamp": tsrs[0]})
	if err != nil {
		return err
	}
	chain := a.vs.FulcioCertificateAuthorities()[0].(*root.FulcioCertificateAuthority)
	var chainPEM bytes.Buffer
	for _, c := range append(chain.Intermediates, chain.Root) {
		pem.Encode(&chainPEM, &pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
	}
	return pushTagConvention(ctx, t, payload, map[string]string{
		AnnotationSignature:   base64.StdEncoding.EncodeToString(sc.Signature()),
		AnnotationCertificate: string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: vc.Certificate().Raw})),
		AnnotationChain:       chainPEM.String(),
		AnnotationBundle:      string(rekorBundle),
		AnnotationTimestamp:   string(timestamp),
	}, o)
}

// logEntry is the authority's Rekor entry for te, with its kind and a
// signed entry timestamp (the "inclusion promise", which the test
// authority keeps to itself) signed again with the log's key.
func (a *Authority) logEntry(te *ca.TestEntity, kind string) (*protorekor.TransparencyLogEntry, error) {
	entries, err := te.TlogEntries()
	if err != nil || len(entries) != 1 {
		return nil, fmt.Errorf("signtest: the authority logged %d entries: %v", len(entries), err)
	}
	tle := entries[0].TransparencyLogEntry()
	tle.KindVersion = &protorekor.KindVersion{Kind: kind, Version: "0.0.1"}
	set, err := a.vs.RekorSignPayload(tlog.RekorPayload{
		Body: base64.StdEncoding.EncodeToString(tle.CanonicalizedBody), IntegratedTime: tle.IntegratedTime,
		LogIndex: tle.LogIndex, LogID: hex.EncodeToString(tle.LogId.KeyId),
	})
	if err != nil {
		return nil, err
	}
	tle.InclusionPromise = &protorekor.InclusionPromise{SignedEntryTimestamp: set}
	return tle, nil
}

// simpleSigning is cosign's payload for an image signature.
func simpleSigning(t *target) []byte {
	b, _ := json.Marshal(map[string]any{
		"critical": map[string]any{
			"identity": map[string]string{"docker-reference": t.digest.Context().Name()},
			"image":    map[string]string{"docker-manifest-digest": t.signed},
			"type":     SimpleSigningType,
		},
		"optional": nil,
	})
	return b
}

// statement is cosign v3's in-toto statement for an image signature.
func statement(t *target) ([]byte, error) {
	alg, hexDigest, ok := strings.Cut(t.signed, ":")
	if !ok {
		return nil, fmt.Errorf("signtest: digest %q", t.signed)
	}
	return json.Marshal(map[string]any{
		"_type":         "https://in-toto.io/Statement/v1",
		"subject":       []any{map[string]any{"name": t.digest.Context().Name(), "digest": map[string]string{alg: hexDigest}}},
		"predicateType": SignPredicateType,
		"predicate":     map[string]any{},
	})
}

// pae is DSSE's pre-authentication encoding, what a DSSE signature signs.
func pae(payloadType string, payload []byte) []byte {
	return fmt.Appendf(nil, "DSSEv1 %d %s %d %s", len(payloadType), payloadType, len(payload), payload)
}

// pushTagConvention adds a simple signing layer to the image's
// sha256-<hex>.sig manifest, creating it if absent, as cosign does.
func pushTagConvention(ctx context.Context, t *target, payload []byte, annotations map[string]string, o Options) error {
	tag := t.digest.Context().Tag(strings.Replace(t.digest.DigestStr(), ":", "-", 1) + ".sig")
	base, err := remote.Image(tag, o.remote(ctx)...)
	var terr *transport.Error
	switch {
	case errors.As(err, &terr) && terr.StatusCode == http.StatusNotFound:
		base = mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	case err != nil:
		return fmt.Errorf("signtest: reading %s: %w", tag, err)
	}
	img, err := mutate.Append(base, mutate.Addendum{Layer: static.NewLayer(payload, SimpleSigningMediaType), Annotations: annotations})
	if err != nil {
		return err
	}
	if err := remote.Write(tag, img, o.remote(ctx)...); err != nil {
		return fmt.Errorf("signtest: pushing %s: %w", tag, err)
	}
	return nil
}

// rawManifest is a manifest pushed as it is.
type rawManifest struct {
	body      []byte
	mediaType types.MediaType
}

func (r rawManifest) RawManifest() ([]byte, error)        { return r.body, nil }
func (r rawManifest) MediaType() (types.MediaType, error) { return r.mediaType, nil }

// pushReferrer pushes b as an OCI referrer of the image, as cosign v3
// does (its BUNDLE_SPEC): go-containerregistry maintains the referrers
// tag on a registry without the referrers API.
func pushReferrer(ctx context.Context, t *target, b *protobundle.Bundle, o Options) error {
	bundleJSON, err := protojson.Marshal(b)
	if err != nil {
		return err
	}
	repo := t.digest.Context()
	config, layer := static.NewLayer([]byte("{}"), emptyMediaType), static.NewLayer(bundleJSON, BundleMediaType)
	for _, l := range []v1.Layer{config, layer} {
		if err := remote.WriteLayer(repo, l, o.remote(ctx)...); err != nil {
			return fmt.Errorf("signtest: pushing a blob to %s: %w", repo, err)
		}
	}
	descOf := func(l v1.Layer, mt types.MediaType) v1.Descriptor {
		d, _ := l.Digest()
		n, _ := l.Size()
		return v1.Descriptor{MediaType: mt, Digest: d, Size: n}
	}
	m := v1.Manifest{
		SchemaVersion: 2, MediaType: types.OCIManifestSchema1,
		Config:  descOf(config, emptyMediaType),
		Layers:  []v1.Descriptor{descOf(layer, BundleMediaType)},
		Subject: &v1.Descriptor{MediaType: t.desc.MediaType, Digest: t.desc.Digest, Size: t.desc.Size},
		Annotations: map[string]string{
			"dev.sigstore.bundle.content":       "dsse-envelope",
			"dev.sigstore.bundle.predicateType": SignPredicateType,
		},
	}
	body, err := json.Marshal(struct {
		v1.Manifest
		ArtifactType string `json:"artifactType"`
	}{m, BundleMediaType})
	if err != nil {
		return err
	}
	sum := sha256.Sum256(body)
	ref := repo.Digest("sha256:" + hex.EncodeToString(sum[:]))
	if err := remote.Put(ref, rawManifest{body, types.OCIManifestSchema1}, o.remote(ctx)...); err != nil {
		return fmt.Errorf("signtest: pushing the referrer of %s: %w", t.digest, err)
	}
	return nil
}
