// Command libcni-driver runs a network configuration list through libcni,
// the library containerd's CRI, CRI-O and cnitool call plugins with, so the
// runtime tests exercise ipam-delegated exactly as those runtimes do.
//
// Usage: libcni-driver add|check|del CONFLIST CONTAINER_ID NETNS IFNAME
//
// Plugins are looked up in CNI_PATH (colon-separated); libcni keeps its
// cache of results in CNI_CACHE_DIR. ADD prints the result as JSON. Any
// failure prints libcni's error on stderr and exits 1.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/libcni"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, err)
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
	paths := filepath.SplitList(os.Getenv("CNI_PATH"))
	cni := libcni.NewCNIConfigWithCacheDir(paths, os.Getenv("CNI_CACHE_DIR"), nil)
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
