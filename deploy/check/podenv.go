package check

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// PodEnv is a container's environment as the kubelet would build it from
// the rendered objects: envFrom ConfigMaps, then env (with $(VAR)
// references expanded). A value from a Secret becomes a placeholder
// naming it (the check never sees real Secrets); a value from the pod's
// fields comes from fields (e.g. "metadata.name").
func (o *Objects) PodEnv(w Workload, c corev1.Container, fields map[string]string) (map[string]string, error) {
	env := map[string]string{}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil {
			continue
		}
		cm, ok := o.ConfigMap(w.Namespace, from.ConfigMapRef.Name)
		if !ok {
			return nil, fmt.Errorf("%s, container %s: envFrom names ConfigMap %s, which the overlay does not create", w, c.Name, from.ConfigMapRef.Name)
		}
		for k, v := range cm.Data {
			env[from.Prefix+k] = v
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = expand(e.Value, env)
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		case e.ValueFrom.FieldRef != nil:
			v, ok := fields[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				return nil, fmt.Errorf("%s, container %s: %s comes from field %s, which the check does not simulate", w, c.Name, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		case e.ValueFrom.ConfigMapKeyRef != nil:
			ref := e.ValueFrom.ConfigMapKeyRef
			cm, ok := o.ConfigMap(w.Namespace, ref.Name)
			v, has := cm.Data[ref.Key]
			if !ok || !has {
				return nil, fmt.Errorf("%s, container %s: %s comes from ConfigMap %s key %s, which the overlay does not create", w, c.Name, e.Name, ref.Name, ref.Key)
			}
			env[e.Name] = v
		default:
			return nil, fmt.Errorf("%s, container %s: %s has a value source the check does not simulate", w, c.Name, e.Name)
		}
	}
	return env, nil
}

// expand replaces $(NAME) with earlier variables, as the kubelet does;
// unknown references stay as written.
func expand(v string, env map[string]string) string {
	var b strings.Builder
	for {
		i := strings.Index(v, "$(")
		if i < 0 {
			b.WriteString(v)
			return b.String()
		}
		j := strings.Index(v[i:], ")")
		if j < 0 {
			b.WriteString(v)
			return b.String()
		}
		name := v[i+2 : i+j]
		b.WriteString(v[:i])
		if val, ok := env[name]; ok {
			b.WriteString(val)
		} else {
			b.WriteString(v[i : i+j+1])
		}
		v = v[i+j+1:]
	}
}

// Files writes the files of the container's ConfigMap volumes under root,
// at their mount paths, and returns a function that maps a path in the
// container to the written file (or reports that no ConfigMap volume
// provides it).
func (o *Objects) Files(w Workload, c corev1.Container, root string) (func(string) (string, bool), error) {
	var mounts []string
	for _, m := range c.VolumeMounts {
		v, ok := w.Volume(m.Name)
		if !ok {
			return nil, fmt.Errorf("%s, container %s: mount %s names no volume", w, c.Name, m.Name)
		}
		if v.ConfigMap == nil {
			continue
		}
		cm, ok := o.ConfigMap(w.Namespace, v.ConfigMap.Name)
		if !ok {
			return nil, fmt.Errorf("%s: volume %s names ConfigMap %s, which the overlay does not create", w, v.Name, v.ConfigMap.Name)
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		for k, data := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, k), []byte(data), 0o644); err != nil {
				return nil, err
			}
		}
		mounts = append(mounts, m.MountPath)
	}
	sort.Strings(mounts)
	return func(p string) (string, bool) {
		for _, m := range mounts {
			if strings.HasPrefix(p, m+"/") {
				local := filepath.Join(root, p)
				if _, err := os.Stat(local); err == nil {
					return local, true
				}
			}
		}
		return "", false
	}, nil
}

// MountedAt reports whether path in container c lies under one of its
// volume mounts, and which volume.
func MountedAt(w Workload, c corev1.Container, path string) (corev1.Volume, bool) {
	for _, m := range c.VolumeMounts {
		if path == m.MountPath || strings.HasPrefix(path, strings.TrimSuffix(m.MountPath, "/")+"/") {
			return w.Volume(m.Name)
		}
	}
	return corev1.Volume{}, false
}

// Volume returns the pod's volume called name; a StatefulSet's claim
// template counts as a volume of that name.
func (w Workload) Volume(name string) (corev1.Volume, bool) {
	for _, v := range w.Template.Spec.Volumes {
		if v.Name == name {
			return v, true
		}
	}
	for _, c := range w.Claims {
		if c.Name == name {
			return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name}}}, true
		}
	}
	return corev1.Volume{}, false
}
