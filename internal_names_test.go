package stagehand_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/stagehand-es/stagehand"
	"github.com/stagehand-es/stagehand/internal/testkit/pgtest"
)

// The internal packages whose errors reach users through the public ones: none of their messages may name an
// internal package, which users cannot import or look up. (The lease-name prefix of log followers is stored
// data, not a message: renaming it would let two releases follow one log side by side during an upgrade.)
func TestNoErrorMessageNamesAnInternalPackage(t *testing.T) {
	t.Parallel()
	internal := []string{"logfollow", "lease", "migrate", "pgnotify"}
	allowed := map[string]bool{`LeasePrefix = "logfollow:"`: true}
	for _, pkg := range internal {
		files, err := filepath.Glob(filepath.Join("internal", pkg, "*.go"))
		require.NoError(t, err)
		require.NotEmpty(t, files, pkg)
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			src, err := os.ReadFile(file)
			require.NoError(t, err)
			f, err := parser.ParseFile(token.NewFileSet(), file, src, 0)
			require.NoError(t, err)
			ast.Inspect(f, func(n ast.Node) bool {
				if spec, ok := n.(*ast.ValueSpec); ok && len(spec.Names) == 1 && len(spec.Values) == 1 {
					if lit, ok := spec.Values[0].(*ast.BasicLit); ok && allowed[spec.Names[0].Name+" = "+lit.Value] {
						return false
					}
				}
				lit, ok := n.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				for _, name := range internal {
					require.NotContains(t, s, name+": ", "%s: a message names package %s: %q", file, name, s)
					require.False(t, strings.HasPrefix(s, name+":"), "%s: a message names package %s: %q", file,
						name, s)
				}
				return true
			})
		}
	}
}

// Migrate's errors speak of stagehand's migrations, not of the package that runs them.
func TestMigrateErrorsNameNoInternalPackage(t *testing.T) {
	t.Parallel()
	_, err := stagehand.Migrate(context.Background(), pgtest.Pool(t), &stagehand.MigrateConfig{Schema: " "})
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "stagehand: "), err.Error())
	require.NotContains(t, err.Error(), "migrate:")
}
