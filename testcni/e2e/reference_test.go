package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/runtime"
	sigsyaml "sigs.k8s.io/yaml"
)

// mdTable is the first table under a markdown heading: its rows' cells,
// header and separator left out.
func mdTable(t *testing.T, doc, heading string) [][]string {
	t.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	require.GreaterOrEqual(t, i, 0, "no heading %q", heading)
	var rows [][]string
	inTable := false
	for _, line := range strings.Split(doc[i+len(heading)+2:], "\n") {
		if strings.HasPrefix(line, "#") {
			break
		}
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		for j := range cells {
			cells[j] = strings.TrimSpace(cells[j])
		}
		if !inTable { // the header
			inTable = true
			continue
		}
		if strings.HasPrefix(cells[0], "---") {
			continue
		}
		rows = append(rows, cells)
	}
	require.NotEmpty(t, rows, "the table under %q", heading)
	return rows
}

var backticked = regexp.MustCompile("`([^`]*)`")

func ticks(s string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(s, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestReferenceTablesMatchTheChart holds docs/reference.md's values and RBAC
// tables to the chart: every value of values.yaml has a row with its
// default, and every row names a value; the RBAC rows are exactly the rules
// helm renders (with the default values, and with the value a row names),
// each bound to the identities the row names.
func TestReferenceTablesMatchTheChart(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(rig.Root, "docs", "reference.md"))
	require.NoError(t, err)
	doc := string(b)

	t.Run("Values", func(t *testing.T) {
		vb, err := os.ReadFile(filepath.Join(rig.Root, chartDir, "values.yaml"))
		require.NoError(t, err)
		var values map[string]any
		require.NoError(t, yamlUnmarshal(vb, &values))
		rows := map[string]any{}
		for _, r := range mdTable(t, doc, "## Values") {
			names, defaults := ticks(r[0]), ticks(r[1])
			if !assert.Len(t, names, 1, "one value per row: %v", r) || !assert.NotEmpty(t, defaults, "a default: %v", r) {
				continue
			}
			var d any
			if assert.NoError(t, yamlUnmarshal([]byte(defaults[0]), &d), "the default of %s is YAML", names[0]) {
				rows[names[0]] = d
			}
		}
		seen := map[string]bool{}
		var walk func(prefix string, v any)
		walk = func(prefix string, v any) {
			if want, ok := rows[prefix]; ok {
				seen[prefix] = true
				assert.Equal(t, normal(t, v), normal(t, want), "the default of %s in values.yaml and in the table", prefix)
				return
			}
			if m, ok := v.(map[string]any); ok && len(m) > 0 {
				for k, sub := range m {
					p := k
					if prefix != "" {
						p = prefix + "." + k
					}
					walk(p, sub)
				}
				return
			}
			t.Errorf("values.yaml's %s (default %v) has no row in docs/reference.md's values table", prefix, v)
		}
		walk("", values)
		for name := range rows {
			assert.True(t, seen[name], "the values table's %s is not a value of values.yaml", name)
		}
	})

	t.Run("RBAC", func(t *testing.T) {
		type key struct{ object, resource, name string }
		want := map[key][]string{}        // with the default values
		wantWith := map[string][]string{} // value -> the rows' extra verbs, as "object resource verb"
		subjects := map[string][]string{} // object -> identities
		last := []string(nil)
		for _, r := range mdTable(t, doc, "## RBAC") {
			require.Len(t, r, 4, "identity | object | resource | verbs: %v", r)
			var who []string
			for _, x := range ticks(r[0]) {
				if !strings.Contains(x, ".") { // a value, not an identity
					who = append(who, x)
				}
			}
			if len(who) == 0 {
				who = last // "the same", or the previous row's without naming it again
			}
			last = who
			objs := ticks(r[1])
			require.Len(t, objs, 1, "one object per row: %v", r)
			object := strings.Fields(r[1])[0] + " " + objs[0] // "Role harvester-ipam-plugin"
			res := ticks(r[2])
			k := key{object: object, resource: res[0]}
			if strings.Contains(r[2], " named ") {
				k.name = res[1]
			}
			base, extra, _ := strings.Cut(r[3], "(and ")
			want[k] = ticks(base)
			if extra != "" {
				verbs, with, ok := strings.Cut(extra, " with ")
				require.True(t, ok, "(and `verb` with `value`): %v", r)
				value := ticks(with)[0]
				for _, v := range ticks(verbs) {
					wantWith[value] = append(wantWith[value], fmt.Sprintf("%s %s %s", object, k.resource, v))
				}
			}
			subjects[object] = append(subjects[object], who...)
		}

		rendered := func(set ...string) (map[key][]string, map[string][]string) {
			rules, bound := map[key][]string{}, map[string][]string{}
			for _, o := range objects(t, render(t, "harvester-ipam", "kube-system", set...)) {
				switch o.GetKind() {
				case "Role", "ClusterRole":
					var role rbacv1.ClusterRole
					require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role))
					for _, rule := range role.Rules {
						for _, res := range rule.Resources {
							names := rule.ResourceNames
							if len(names) == 0 {
								names = []string{""}
							}
							for _, n := range names {
								rules[key{o.GetKind() + " " + o.GetName(), res, n}] = rule.Verbs
							}
						}
					}
				case "RoleBinding", "ClusterRoleBinding":
					var rb rbacv1.RoleBinding
					require.NoError(t, runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &rb))
					for _, s := range rb.Subjects {
						bound[rb.RoleRef.Kind+" "+rb.RoleRef.Name] = append(bound[rb.RoleRef.Kind+" "+rb.RoleRef.Name], s.Name)
					}
				}
			}
			return rules, bound
		}
		rules, bound := rendered()
		assert.Equal(t, want, rules, "docs/reference.md's RBAC rows against the chart's rules (default values)")
		for object, who := range subjects {
			assert.Equal(t, set(who), set(bound[object]), "who %s binds, by the table and by the chart", object)
		}
		for value, extra := range wantWith {
			with, _ := rendered(value + "=true")
			var got []string
			for k, verbs := range with {
				for _, v := range verbs {
					if !contains(rules[k], v) {
						got = append(got, fmt.Sprintf("%s %s %s", k.object, k.resource, v))
					}
				}
			}
			assert.Equal(t, set(extra), set(got), "what %s=true adds, by the table and by the chart", value)
		}
	})
}

// normal is v as JSON would hold it, so that YAML's ints and a values
// file's floats compare.
func normal(t *testing.T, v any) any {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	var out any
	require.NoError(t, json.Unmarshal(b, &out))
	return out
}

func set(xs []string) []string {
	m := map[string]bool{}
	for _, x := range xs {
		m[x] = true
	}
	out := make([]string, 0, len(m))
	for x := range m {
		out = append(out, x)
	}
	sort.Strings(out)
	return out
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// yamlUnmarshal decodes YAML (or JSON) into v, as JSON would.
func yamlUnmarshal(b []byte, v any) error {
	// sigs.k8s.io/yaml, not apimachinery's ToJSON: that one passes anything
	// that starts with '{' on as JSON, and a YAML flow map is not.
	j, err := sigsyaml.YAMLToJSON(b)
	if err != nil {
		return err
	}
	return json.Unmarshal(j, v)
}
