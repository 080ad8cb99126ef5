// Package admin is the records admin API: what `cri-image-proxy records`
// does (list, show, explain, forget, revoke, gc, export), as a Service
// with two implementations: Client, JSON over HTTP on the daemon's
// root-only unix socket (the daemon holds the database's lock), and Local,
// on the database file and a guard, used by the daemon behind that socket
// and by the commands when no daemon runs. Errors keep ensure.ErrNotFound
// across the socket (404).
package admin
