// Package unixsock serves on a unix socket the way a node daemon should:
// one instance per socket, stale sockets cleaned up, permissions set before
// anyone can connect.
//
// Listen takes an exclusive lock on PATH.lock for the life of the listener,
// so a second instance fails at once and names the first one's PID instead
// of stealing its socket. A socket file left by a crashed instance is
// removed; one that still answers is never touched.
//
// Under systemd socket activation (a .socket unit) the socket is the
// service manager's: Activated collects what it passed, Listen takes the
// one bound to its path and Close leaves the file in place. The manager
// keeps listening while the daemon restarts, so a client's call waits in
// the backlog instead of failing.
//
// PeerOf says who is at the other end of a connection: the uid, gid,
// supplementary groups and pid the kernel recorded at connect time
// (SO_PEERCRED, SO_PEERGROUPS). Unlike the file's mode, which a service
// manager may set, they are what a server can decide on.
package unixsock
