// Command libcni-driver runs a network configuration list through libcni,
// the library containerd's CRI, CRI-O and cnitool call plugins with, so the
// runtime tests exercise ipam-delegated exactly as those runtimes do.
//
// Usage: libcni-driver add|check|del CONFLIST CONTAINER_ID NETNS IFNAME
//
// Plugins are looked up in CNI_PATH (colon-separated); libcni keeps its
// cache of results in CNI_CACHE_DIR, which must be set (libcni would fall
// back to the machine's /var/lib/cni). ADD prints the result as JSON. A
// failure prints libcni's error on stderr, and for a CNI error object also
// a line "cni-error code=N msg=...", then exits 1.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
		var cniErr *types.Error
		if errors.As(err, &cniErr) {
			fmt.Fprintf(os.Stderr, "cni-error code=%d msg=%s\n", cniErr.Code, cniErr.Msg)
		}
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) != 5 {
		return fmt.Errorf("usage: libcni-driver add|check|del CONFLIST CONTAINER_ID NETNS IFNAME")
	}
	command, file, id, netns, ifname := args[0], args[1], args[2], args[3], args[4]
	list, err := libcni.ConfListFromFile(file)
	if err != nil {
		return err
	}
	cacheDir := os.Getenv("CNI_CACHE_DIR")
	if cacheDir == "" {
		return fmt.Errorf("CNI_CACHE_DIR must be set")
	}
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	cni := libcni.NewCNIConfigWithCacheDir(paths, cacheDir, nil)
	rt := &libcni.RuntimeConf{ContainerID: id, NetNS: netns, IfName: ifname}
	ctx := context.Background()

	switch command {
	case "add":
		result, err := cni.AddNetworkList(ctx, list, rt)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(result)
	case "check":
		return cni.CheckNetworkList(ctx, list, rt)
	case "del":
		return cni.DelNetworkList(ctx, list, rt)
	}
	return fmt.Errorf("unknown command %q", command)
}
