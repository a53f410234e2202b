// Package controller reconciles kind "deployment" (krane.cluster.v1.Deployment):
// a user workload runs as one ReplicaSet in the workload's namespace, and its
// pods are reported upstream as instances.
//
// Files by concern:
//   - config.go: the plugin's `config {}` block, its JSON Schema and defaults;
//   - validate.go: checks a desired Deployment before anything reaches the
//     cluster (invalid input is a permanent error naming the field);
//   - build.go: pure functions from a Deployment to the ReplicaSet;
//   - controller.go: Describe, Configure, Apply, Inventory, Shutdown;
//   - roll.go: template changes, max_concurrent_rolls at a time, each
//     given up after roll_progress_deadline;
//   - namespace.go: namespaces created on demand and removed when empty;
//   - pullsecrets.go: the configured registry pull Secrets copied into
//     every workload namespace, kept in sync, removed when unwanted;
//   - pulltargets.go: which namespaces those are (the deployments held
//     from ctrl, never a reserved one) and the proof that a copy is the
//     plugin's own;
//   - status.go: WatchStatus, pods and ReplicaSets to DeploymentStatus;
//   - index.go: the informer caches indexed by deployment id, so one
//     deployment's objects are found without scanning the whole cache.
//
// Pod replacement. A ReplicaSet never replaces running pods when its
// template changes, so the template is immutable per ReplicaSet: the
// ReplicaSet is named <k8s_name>-<template hash> and its selector includes
// the hash. A template change (image, env, resources, probes, command...)
// applies a new ReplicaSet and, once it is available, deletes the old one
// (foreground, so its pods go with it); a replica change keeps the name and
// only scales. roll.go bounds how many deployments roll at once and gives
// up a roll not available within roll_progress_deadline, keeping the old
// ReplicaSet.
package controller
