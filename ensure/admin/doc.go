// Package admin is the records admin API: what `cri-image-proxy records`
// does (list, show, explain, forget, revoke, gc, export), as a Service
// with two implementations: Client, JSON over HTTP on the daemon's unix
// socket (the daemon holds the database's lock), and Local, on the
// database file and a guard, used by the daemon behind that socket and by
// the commands when no daemon runs. Errors keep records.ErrNotFound across
// the socket (404).
//
// NewServer serves that socket to root and the admin group only (Callers),
// deciding on the caller's uid and groups as the kernel recorded them at
// connect time, never on the socket file's mode, which is systemd's under
// socket activation: anyone else gets 403 and a log line with its uid and
// gid.
package admin
