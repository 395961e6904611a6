//go:build tools

// Package k8sapi pins the Kubernetes API server the node agent's end-to-end test runs against:
// scripts/k8s-api.sh builds k8s.io/kubernetes/cmd/kube-apiserver from this module (whose
// replace directives stand in for the kubernetes module's own staging ones, which `go install`
// refuses) into bin/.
package k8sapi

import _ "k8s.io/kubernetes/cmd/kube-apiserver/app"
