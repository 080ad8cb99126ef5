package unixsock

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Peer is the process at the other end of a unix socket connection, as
// the kernel recorded it when that process connected: its credentials
// cannot be forged by the caller and do not change with what it does
// after, whatever the socket file's mode or owner.
type Peer struct {
	PID      int32
	UID, GID uint32
	// Groups are the caller's supplementary groups (SO_PEERGROUPS, Linux
	// 4.13); nil where the kernel cannot say, and then only GID counts.
	Groups []uint32
}

// InGroup reports whether gid is the peer's group or one of its
// supplementary groups, as the kernel decides a file's group access.
func (p Peer) InGroup(gid uint32) bool {
	return p.GID == gid || slices.Contains(p.Groups, gid)
}

// PeerOf reads the credentials of the process at the other end of conn
// (SO_PEERCRED, SO_PEERGROUPS). conn must be a unix socket connection.
func PeerOf(conn net.Conn) (Peer, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return Peer{}, fmt.Errorf("peer credentials: a %T is not a unix socket connection", conn)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	var p Peer
	var serr error
	if err := raw.Control(func(fd uintptr) {
		var cred *unix.Ucred
		if cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); serr != nil {
			return
		}
		p = Peer{PID: cred.Pid, UID: cred.Uid, GID: cred.Gid}
		// Without the groups the check is narrower (the primary group
		// only), never wider: an error leaves them out.
		p.Groups, _ = peerGroups(int(fd))
	}); err != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", err)
	}
	if serr != nil {
		return Peer{}, fmt.Errorf("peer credentials: %w", serr)
	}
	return p, nil
}

// peerGroups reads SO_PEERGROUPS, an array of gid_t whose length the
// kernel tells (ERANGE) when the buffer is too small. x/sys/unix has no
// helper for an array option.
func peerGroups(fd int) ([]uint32, error) {
	buf := make([]uint32, 64)
	for range 2 {
		size := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&size)), 0)
		switch {
		case errno == unix.ERANGE && int(size/4) > len(buf):
			buf = make([]uint32, size/4)
		case errno != 0:
			return nil, errno
		default:
			return buf[:size/4], nil
		}
	}
	return nil, errors.New("SO_PEERGROUPS: the groups changed size while being read")
}
