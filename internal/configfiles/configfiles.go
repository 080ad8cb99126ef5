package configfiles

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
)

// List returns the files path stands for. Its errors do not say which
// configuration: callers prefix them.
func List(path string) ([]string, error) {
	if path == "" {
		return nil, errors.New("no path given")
	}
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.IsDir() {
		return []string{path}, nil
	}
	entries, err := os.ReadDir(path)
	if err != nil {
		return nil, err
	}
	var files []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".json", ".yaml", ".yml":
			if !e.IsDir() {
				files = append(files, filepath.Join(path, e.Name()))
			}
		}
	}
	sort.Strings(files)
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.json, *.yaml or *.yml file in directory %s", path)
	}
	return files, nil
}
