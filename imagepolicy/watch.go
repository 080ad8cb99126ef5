package imagepolicy

import (
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

// The plugins' own files (a policy, its keys, a trusted root) are read by
// the plugin at each run, not by the engine: a change of one does not
// change the configuration, yet verdicts cached before it may be wrong
// after it (a revoked key's allow). A provider's watchFiles name them; the
// daemon watches their directories and tells the engine of each change
// (FileChanged), and the provider's cached verdicts are dropped: the next
// decision runs the plugin on the new files.

// fileWatch is the state of one provider's watched paths.
type fileWatch struct {
	mu    sync.Mutex
	paths []watchedPath
}

// watchedPath is a watched file or directory and what it was when last
// seen.
type watchedPath struct {
	path string
	dir  bool
	seen fileState
}

// fileState is a file as stat (following symbolic links) sees it: which
// file it is, its size and time. A Kubernetes ConfigMap volume replaces a
// file by swapping a symbolic link in its directory: no event names the
// file, but its state changes.
type fileState struct {
	info  os.FileInfo // nil: absent
	size  int64
	mtime time.Time
}

func statOf(path string) fileState {
	fi, err := os.Stat(path)
	if err != nil {
		return fileState{}
	}
	return fileState{info: fi, size: fi.Size(), mtime: fi.ModTime()}
}

func (a fileState) same(b fileState) bool {
	if a.info == nil || b.info == nil {
		return a.info == nil && b.info == nil
	}
	return os.SameFile(a.info, b.info) && a.size == b.size && a.mtime.Equal(b.mtime)
}

func newFileWatch(paths []string) *fileWatch {
	w := &fileWatch{}
	for _, p := range paths {
		st := statOf(p)
		w.paths = append(w.paths, watchedPath{path: p, dir: st.info != nil && st.info.IsDir(), seen: st})
	}
	return w
}

// changed reports whether an event for path (a create, write, remove,
// rename or chmod fsnotify saw in a watched directory) changes one of the
// watched paths: the path itself, an entry of a watched directory, or a
// sibling of a watched file whose state changed with it (a symbolic link
// swapped, a file renamed over it).
func (w *fileWatch) changed(path string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	dir := filepath.Dir(path)
	changed := false
	for i := range w.paths {
		wp := &w.paths[i]
		switch {
		case path == wp.path, wp.dir && dir == wp.path:
			changed = true
			wp.seen = statOf(wp.path)
		case !wp.dir && dir == filepath.Dir(wp.path):
			if st := statOf(wp.path); !st.same(wp.seen) {
				changed = true
				wp.seen = st
			}
		}
	}
	return changed
}

// dirs are the directories to watch for the paths: a file's directory (a
// file is replaced by a rename over it, which a watch of the file itself
// would lose), a directory itself.
func (w *fileWatch) dirs() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []string
	for _, wp := range w.paths {
		if wp.dir {
			out = append(out, wp.path)
		} else {
			out = append(out, filepath.Dir(wp.path))
		}
	}
	return out
}

// WatchedDirs are the directories the daemon watches for the providers'
// watchFiles, each once, sorted.
func (e *Engine) WatchedDirs() []string {
	var out []string
	for _, p := range e.set.Load().providers {
		out = append(out, p.watch.dirs()...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// FileChanged is told of a change of path in a watched directory. Every
// provider whose watchFiles it changes has its cached verdicts dropped,
// and a verdict its plugin is making now is not cached: the plugin may
// have read the file before the change. It returns the names of those
// providers.
func (e *Engine) FileChanged(path string) []string {
	path = filepath.Clean(path)
	var dropped []string
	for _, p := range e.set.Load().providers {
		if !p.watch.changed(path) {
			continue
		}
		n := p.dropVerdicts()
		p.metrics.fileChanges.WithLabelValues(p.cfg.Name).Inc()
		p.log.Info("image policy: a file of the plugin changed; its cached verdicts are dropped", "plugin", p.cfg.Name, "file", path, "dropped", n)
		dropped = append(dropped, p.cfg.Name)
	}
	return dropped
}

// dropVerdicts drops the provider's cached verdicts, and makes the ones
// being made now uncacheable.
func (p *provider) dropVerdicts() int {
	p.storeMu.Lock()
	defer p.storeMu.Unlock()
	p.epoch.Add(1)
	return p.cache.Clear()
}
