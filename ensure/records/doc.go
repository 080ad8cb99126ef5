// Package records is the ensure-secret-pulled-images database (KEP-2535):
// a bbolt file of pulled records (the kubelet's ImagePulledRecord, keyed by
// image ID), preloaded records (the kubelet's ImagePreloadedRecord: the
// names an image had before its first recorded pull) and pull intents,
// with a salted hash of each credential, never the credential itself.
//
// Contract:
//   - Every write is one transaction, committed (fsync) before it returns:
//     an acknowledged record or intent survives a crash (tested with kill
//     -9). RecordPull adds a credential and drops its intent atomically.
//   - A credential is merged as the kubelet merges it (MergeCredential):
//     secrets by hash and, when known, coordinates (a rotated secret's
//     entry takes the new hash); at most 100 per repository.
//   - Restricted(repo) is answered from memory (an index of repositories
//     with a mapping not accessible to every pod), erring towards true; it
//     runs on every ImageStatus.
//   - A preloaded record is written only with an image's first record, in
//     its transaction (RecordPull), and deleted with it (Forget, Prune) or
//     by a revoke; Preloaded(imageRef) is answered from memory, loaded at
//     open: a name it lacks needs verification.
//   - The layout is versioned and migrated forward at open; a database
//     written by a newer version is refused, never rewritten.
//   - Open with ReadOnly never writes (the records tools); a missing file
//     is created only by a read-write open, 0600 in a 0700 directory,
//     initialised aside and linked into place whole. Only an absent file
//     is created: an existing one that is not a whole ensure database
//     (empty, truncated, garbage, another bbolt layout) is ErrNotADatabase
//     and left untouched, as bbolt would make an empty file into a new
//     database (a new salt, no records).
//   - Undecodable records are skipped by List and reported by key; Get of
//     one is an error, which callers treat as "verify".
//   - ProbeWrite checks that the file takes writes as a record write needs
//     them (commits of a small value, of one larger than a record write,
//     then of their deletion) and changes no record, intent or counter; one
//     that fails leaves the file as it was.
//
// The bbolt file (mode 0600) is laid out as:
//
//	write-probe                          ProbeWrite's value, between its
//	                                     commits only (or a crash or failed
//	                                     write between them: the next probe
//	                                     removes it); outside the schema
//	v1                                   schema bucket
//	├── meta
//	│   ├── version : <uvarint>          database version, see migrations
//	│   ├── salt    : <32 bytes>         random, made when the file is made
//	│   ├── records : <uvarint>          number of records (kept with each write)
//	│   └── intents : <uvarint>          number of intents
//	├── records
//	│   └── *image ID* : <JSON ImagePulledRecord>
//	├── intents
//	│   └── *intent ID* : <JSON ImagePullIntent>
//	├── repos
//	│   └── *repository* : <uvarint>   records with a mapping for it that is
//	│                                  not node-wide ("restricted"); kept
//	│                                  with each write, loaded at open
//	├── updated                          (version 2)
//	│   └── *image ID* : <8 bytes>       when its record last changed, Unix
//	│                                    nanoseconds big-endian; kept with
//	│                                    each write of a record
//	├── verified                         (version 3)
//	│   └── *image ID*\0*repository*\0*credential* : <8 bytes>
//	│                                    when the credential (CredentialKeys:
//	│                                    h:HASH, s:SECRET-UID, sa:UID/NS/NAME,
//	│                                    node) was last verified for the image
//	│                                    as the repository; written with the
//	│                                    record, deleted with it
//	├── layers                           (version 4)
//	│   └── *image ID* : <8 bytes><diff_id>\n<diff_id>…
//	│                                    when the proxy first learnt the
//	│                                    image's layers (its pull, or its
//	│                                    first sighting on the node), and
//	│                                    their diff_ids in order; kept while
//	│                                    the image is on the node or has a
//	│                                    record, loaded into memory at open
//	├── vouched                          (version 4)
//	│   └── *repository*\0*diff_id*\0*image ID* : <8 bytes>
//	│                                    the repository vouched for the layer
//	│                                    (supplied it, or proved its bytes)
//	│                                    in the verified pull of the image;
//	│                                    written with that pull's record,
//	│                                    deleted with the record
//	└── preloaded                        (version 5)
//	    └── *image ID* : <JSON ImagePreloadedRecord>
//	                                     the names (repo:tag, repo@digest) the
//	                                     runtime listed the image under before
//	                                     its first record, written with that
//	                                     record, deleted with it (and by a
//	                                     revoke); loaded into memory at open
//
// The layers and vouched buckets are what per-layer decisions read: a
// runtime shares a layer between images by its diff_id, so a layer one
// tenant's private image brought to the node can be named by another
// image; which images hold a layer, since when, and which repositories
// vouched for it, decide whether a pull must prove it by its bytes.
//
// The repos index lets ImageStatus of a repository no record restricts
// pass without decoding (the common case: public and node-wide images),
// and without reading the records. The updated index lets garbage
// collection find the records of images gone from the node by reading
// ~100 bytes per record instead of the records themselves, which would
// bring the whole file into the daemon's memory every run. The preloaded
// bucket is held in memory whole (it has an entry only for images that
// were on the node before a pull through the proxy recorded them), so that
// ImageStatus and CreateContainer of a preloaded name read and decode
// nothing.
//
// Update this drawing with every schema change; each change bumps the
// version and comes with a migration and its test.
//
// The credential model and the kubelet's rules for it (MergeCredential,
// SameSecret, CredentialKeys) are in credential.go and know nothing of
// bbolt; the store is store.go over the layout of buckets.go and the
// migrations; the repos index is restricted.go, the record cache cache.go,
// the preloaded records and their index preloaded.go.
//
// Every write is committed (fsync) before the CRI answer that depends on it.
// A second process opening the file fails after Options.OpenTimeout instead
// of hanging on the file lock.
package records
