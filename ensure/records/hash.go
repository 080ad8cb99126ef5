package records

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// saltLen is the size of the per-database salt.
const saltLen = 32

// Auth is a pull's credential as the CRI carries it (AuthConfig), less
// the server address, which says where, not who.
type Auth struct {
	Username, Password, Auth, IdentityToken, RegistryToken string
}

// hashAuth returns the salted hash of a request's credential, or "" for a
// request without one. The salt is random per database: equal credentials
// match on one node, and the file is no lookup table for anyone who has it.
//
// The kubelet hashes the JSON of its own AuthConfig without salt
// (pkg/credentialprovider/keyring.go, hashAuthConfig); the CRI only gives
// us these fields, length-prefixed so no two credentials share an input.
// server_address is left out: it says where, not who.
func hashAuth(salt []byte, a Auth) string {
	if !hasCredential(a) {
		return ""
	}
	h := sha256.New()
	h.Write(salt)
	for _, f := range []string{a.Username, a.Password, a.Auth, a.IdentityToken, a.RegistryToken} {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(f)))
		h.Write(n[:])
		h.Write([]byte(f))
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// hasCredential reports whether a request carries a credential.
func hasCredential(a Auth) bool {
	return (a.Username != "" || a.Password != "" || a.Auth != "" || a.IdentityToken != "" || a.RegistryToken != "")
}
