// Package periodic runs work every interval until a context ends: the
// daemon's background loops (purging caches, dropping expired tokens,
// garbage-collecting records) are all this one loop.
package periodic
