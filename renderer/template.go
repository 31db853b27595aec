package main

// template mirrors `helm template` of helm.sh/helm/v4 pkg/cmd/template.go and runInstall in
// pkg/cmd/install.go at the pinned version, for exactly the flags module-manager passes:
//
//	helm template --namespace NS --kube-version KV [--include-crds] [--skip-tests] --values - \
//	    [--api-versions A]... [--is-upgrade] -- RELEASE CHART
//
// Same steps, same order, same error texts; what the CLI does besides (registry client, plugins,
// --show-only, --output-dir, signals, dependency update) is not reachable with those flags.

import (
	"bytes"
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"helm.sh/helm/v4/pkg/action"
	"helm.sh/helm/v4/pkg/chart"
	"helm.sh/helm/v4/pkg/chart/common"
	"helm.sh/helm/v4/pkg/chart/loader"
	chartloader "helm.sh/helm/v4/pkg/chart/v2/loader"
	"helm.sh/helm/v4/pkg/cli"
	release "helm.sh/helm/v4/pkg/release/v1"
)

// quiet discards Helm's log lines (the CLI prints warnings to stderr, which module-manager drops).
var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func template(req *request) (string, error) {
	// A fresh configuration per render: Install.RunWithContext replaces its capabilities, kube
	// client and release storage with client-only ones (never a cluster, so `lookup` returns
	// nothing).
	cfg := action.NewConfiguration()
	cfg.SetLogger(quiet.Handler())
	client := action.NewInstall(cfg)
	if req.KubeVersion != "" {
		parsed, err := common.ParseKubeVersion(req.KubeVersion)
		if err != nil {
			return "", fmt.Errorf("invalid kube version '%s': %w", req.KubeVersion, err)
		}
		client.KubeVersion = parsed
	}
	// The defaults of the CLI's install flags that are not zero values.
	client.ServerSideApply = true
	client.Timeout = 300 * time.Second
	client.DryRunStrategy = action.DryRunClient
	client.ReleaseName = "release-name"
	client.Replace = true
	apis, err := splitAPIVersions(req.APIVersions)
	if err != nil {
		return "", err
	}
	client.APIVersions = common.VersionSet(apis)
	client.IncludeCRDs = req.IncludeCRDs
	client.IsUpgrade = req.IsUpgrade
	rel, err := runInstall(req, client)
	if err != nil {
		if rel != nil {
			return "", fmt.Errorf("%w\n\nUse --debug flag to render out invalid YAML", err)
		}
		return "", err
	}
	var manifests bytes.Buffer
	fmt.Fprintln(&manifests, strings.TrimSpace(rel.Manifest))
	for _, m := range rel.Hooks {
		if req.SkipTests && slices.Contains(m.Events, release.HookTest) {
			continue
		}
		fmt.Fprintf(&manifests, "---\n# Source: %s\n%s\n", m.Path, m.Manifest)
	}
	return manifests.String(), nil
}

// splitAPIVersions reads each value as pflag's StringSlice does (CSV), so that both
// `--api-versions a --api-versions b` and `--api-versions a,b` mean the same here as there.
func splitAPIVersions(values []string) ([]string, error) {
	var out []string
	for _, v := range values {
		if v == "" {
			continue
		}
		fields, err := csv.NewReader(strings.NewReader(v)).Read()
		if err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("invalid argument %q for \"-a, --api-versions\" flag: %w", v, err)
		}
		out = append(out, fields...)
	}
	return out, nil
}

// settings are the CLI's defaults under the empty environment the renderer runs in.
var settings = cli.New()

func runInstall(req *request, client *action.Install) (*release.Release, error) {
	name, chartRef, err := client.NameAndChart([]string{req.Release, req.Chart})
	if err != nil {
		return nil, err
	}
	client.ReleaseName = name
	cp, err := client.LocateChart(chartRef, settings)
	if err != nil {
		return nil, err
	}
	vals, err := chartloader.LoadValues(strings.NewReader(req.Values))
	if err != nil {
		return nil, fmt.Errorf("failed to parse %s: %w", "-", err)
	}
	vals = chartloader.MergeMaps(map[string]any{}, vals)
	chartRequested, err := loader.Load(cp)
	if err != nil {
		return nil, err
	}
	ac, err := chart.NewAccessor(chartRequested)
	if err != nil {
		return nil, err
	}
	if err := checkIfInstallable(ac); err != nil {
		return nil, err
	}
	if req := ac.MetaDependencies(); len(req) > 0 {
		if _, err := sourceDateEpochFromEnv(); err != nil {
			return nil, err
		}
		if err := action.CheckDependencies(chartRequested, req); err != nil {
			return nil, fmt.Errorf("an error occurred while checking for chart dependencies. You may need to run 'helm dependency build' to fetch missing dependencies: %w", err)
		}
	}
	client.Namespace = req.Namespace
	ri, err := client.RunWithContext(context.Background(), chartRequested, vals)
	rel, rerr := releaserToV1Release(ri)
	if rerr != nil {
		return nil, rerr
	}
	return rel, err
}

func checkIfInstallable(ch chart.Accessor) error {
	meta := ch.MetadataAsMap()
	switch meta["Type"] {
	case "", "application":
		return nil
	}
	return fmt.Errorf("%s charts are not installable", meta["Type"])
}

func releaserToV1Release(rel any) (*release.Release, error) {
	switch r := rel.(type) {
	case release.Release:
		return &r, nil
	case *release.Release:
		return r, nil
	case nil:
		return nil, nil
	default:
		return nil, fmt.Errorf("unsupported release type: %T", rel)
	}
}

func sourceDateEpochFromEnv() (*time.Time, error) {
	epochStr, ok := os.LookupEnv("SOURCE_DATE_EPOCH")
	if !ok || epochStr == "" {
		return nil, nil
	}
	epoch, err := strconv.ParseInt(epochStr, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("invalid SOURCE_DATE_EPOCH: %w", err)
	}
	if epoch < 0 {
		return nil, errors.New("invalid SOURCE_DATE_EPOCH: must not be negative")
	}
	t := time.Unix(epoch, 0).UTC()
	return &t, nil
}
