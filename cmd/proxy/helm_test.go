package main

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// helmValues is the part of grafana/mimir-distributed's values that puts
// a sidecar in the store-gateway pods.
type helmValues struct {
	StoreGateway struct {
		ExtraArgs            map[string]string `yaml:"extraArgs"`
		ExtraContainers      []helmContainer   `yaml:"extraContainers"`
		ZoneAwareReplication struct {
			Enabled bool
			Zones   []struct{ Name string }
		} `yaml:"zoneAwareReplication"`
	} `yaml:"store_gateway"`
}

type helmContainer struct {
	Name  string
	Image string
	Args  []string
	Env   []struct {
		Name      string
		Value     string
		ValueFrom struct {
			FieldRef struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	}
}

// helmPod is one store-gateway pod the chart makes from the values: the
// sidecar's arguments with its environment expanded, as the kubelet
// expands them, and the store-gateway's arguments as the chart writes
// them.
type helmPod struct {
	where        string
	sidecar      []string
	storeGateway []string
}

// zoneLabel is the pod label the chart gives a zone-aware store-gateway:
// zone=<the zone's name>.
const zoneLabel = "metadata.labels['zone']"

// helmPods returns a pod for every zone of every mcsidecar container in
// the store-gateway's extraContainers of a values file, or nothing for a
// file that is not such values.
func helmPods(t *testing.T, data []byte) []helmPod {
	t.Helper()
	var v helmValues
	if err := yaml.Unmarshal(data, &v); err != nil {
		return nil // a stream of manifests, not values
	}
	sg := v.StoreGateway
	zones := []string{""}
	if sg.ZoneAwareReplication.Enabled {
		zones = nil
		for _, z := range sg.ZoneAwareReplication.Zones {
			zones = append(zones, z.Name)
		}
	}
	// The chart writes each extraArgs entry as -key=value, in key order.
	var sgArgs []string
	keys := make([]string, 0, len(sg.ExtraArgs))
	for k := range sg.ExtraArgs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		sgArgs = append(sgArgs, fmt.Sprintf("-%s=%s", k, sg.ExtraArgs[k]))
	}
	var pods []helmPod
	for _, c := range sg.ExtraContainers {
		if !strings.Contains(c.Image, "mcsidecar") {
			continue
		}
		for _, zone := range zones {
			env := map[string]string{}
			for _, e := range c.Env {
				switch {
				case e.ValueFrom.FieldRef.FieldPath == zoneLabel && zone != "":
					env[e.Name] = zone
				case e.ValueFrom.FieldRef.FieldPath != "":
					t.Errorf("%s: env %s from %s, which the test does not know", c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
				default:
					env[e.Name] = e.Value
				}
			}
			pod := helmPod{where: "zone " + zone, storeGateway: slices.Clone(sgArgs)}
			if zone == "" {
				pod.where = "(no zones)"
			} else {
				pod.storeGateway = append(pod.storeGateway, "-store-gateway.sharding-ring.instance-availability-zone="+zone)
			}
			for _, a := range c.Args {
				pod.sidecar = append(pod.sidecar, expandEnv(a, env))
			}
			pods = append(pods, pod)
		}
	}
	return pods
}

// envRef is a Kubernetes $(NAME) reference in a container's arguments.
var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandEnv replaces the $(NAME) references of arg whose NAME env defines,
// leaving the others as they are, as the kubelet does.
func expandEnv(arg string, env map[string]string) string {
	return envRef.ReplaceAllStringFunc(arg, func(ref string) string {
		if v, ok := env[envRef.FindStringSubmatch(ref)[1]]; ok {
			return v
		}
		return ref
	})
}
