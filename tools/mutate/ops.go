package main

// The project's own mutation operators: the kinds of bug that got through
// every test before and that gremlins' operators (a boundary moved, a
// condition negated, arithmetic swapped) never plant. Each is a rewrite of
// the file's syntax tree (go/ast), printed back with go/printer:
//
//	COUNT_SHIFT    a comparison with a whole-number constant takes a count
//	               one higher: x == 0 -> x <= 1, x != 0 -> x > 1, x > 0 ->
//	               x > 1, x >= 1 -> x >= 2, x < 1 -> x < 2, x <= 0 -> x <= 1
//	               (len(earlier) == 0 -> len(earlier) <= 1: a reclaim that
//	               waits for two earlier sandboxes)
//	DROP_ELEMENT   one element dropped from an append (append(s, a, b) ->
//	               append(s, b); append(s, a) -> append(s)) or from a
//	               []string literal (an environment, an argument list)
//	RETURN_INPUT   a function whose first parameter has its result's type
//	               returns that parameter (func guarded(env []string)
//	               []string { return env }), and a call of such a function,
//	               or of a standard one that returns its first argument's
//	               type (strings.TrimSpace, filepath.Clean, slices.Clip...),
//	               replaced by that argument
//	DROP_FLAG      one operand of a bitwise or dropped: a|b -> a, a|b -> b
//
// Mutants are made from syntax alone, with no type checking: a mutant that
// does not compile is counted as such (not viable), never as killed.

import (
	"bytes"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"reflect"
	"strconv"
	"strings"
)

// Operator names, as the table and the equivalents file spell them.
const (
	opCountShift  = "COUNT_SHIFT"
	opDropElement = "DROP_ELEMENT"
	opReturnInput = "RETURN_INPUT"
	opDropFlag    = "DROP_FLAG"
)

// ownOps are the own operators' names.
var ownOps = map[string]bool{opCountShift: true, opDropElement: true, opReturnInput: true, opDropFlag: true}

// ownMutant is one rewrite of one file.
type ownMutant struct {
	Op           string
	Line, Column int
	// Orig and Mutated are the rewritten expression or declaration, before
	// and after, as go/printer prints them on one line.
	Orig, Mutated string
	// Src is the whole mutated file.
	Src []byte
}

// identityCalls are standard functions whose result has their first
// argument's type: a call of one replaced by that argument compiles.
var identityCalls = map[string]bool{
	"strings.TrimSpace": true, "strings.TrimSuffix": true, "strings.TrimPrefix": true, "strings.Trim": true,
	"strings.TrimLeft": true, "strings.TrimRight": true, "strings.ToLower": true, "strings.ToUpper": true,
	"strings.ReplaceAll": true, "strings.Replace": true, "strings.Clone": true,
	"bytes.TrimSpace": true, "bytes.TrimSuffix": true, "bytes.TrimPrefix": true, "bytes.Clone": true,
	"filepath.Clean": true, "filepath.ToSlash": true, "filepath.FromSlash": true, "path.Clean": true,
	"slices.Clip": true, "slices.Clone": true, "slices.Compact": true,
	"maps.Clone": true,
}

// mutate makes every mutant of the operators in one Go file; consts are
// the package's constants (of its other files too).
func mutate(filename string, src []byte, consts map[string]bool) ([]ownMutant, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, filename, src, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	m := &mutator{fset: fset, file: f, identity: map[string]bool{}, imports: map[string]bool{}, consts: consts}
	for _, im := range f.Imports {
		name := ""
		if im.Name != nil {
			name = im.Name.Name
		} else if p, err := strconv.Unquote(im.Path.Value); err == nil {
			// The package's name is its path's last element, mostly (not
			// a /vN suffix): a wrong guess only makes a drop a reslice.
			name = p[strings.LastIndex(p, "/")+1:]
		}
		m.imports[name] = true
	}
	// The package's own functions that return their first parameter's type
	// (in this file; a call of one in another file is not rewritten).
	for _, d := range f.Decls {
		// One result only: a call of a function of two is no expression to
		// replace by a value.
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && returnsFirstParam(fd) >= 0 && len(fd.Type.Results.List) == 1 && len(fd.Type.Results.List[0].Names) <= 1 {
			m.identity[fd.Name.Name] = true
		}
	}
	ast.Inspect(f, m.visit)
	return m.out, m.err
}

type mutator struct {
	fset     *token.FileSet
	file     *ast.File
	identity map[string]bool
	imports  map[string]bool // the names the file's imports are known by
	consts   map[string]bool
	out      []ownMutant
	err      error
}

func (m *mutator) visit(n ast.Node) bool {
	if m.err != nil {
		return false
	}
	switch n := n.(type) {
	case *ast.GenDecl:
		// Constants are what they are: 1 << 20 is no count to shift.
		return n.Tok != token.CONST
	case *ast.BinaryExpr:
		m.countShift(n)
		m.dropFlag(n)
	case *ast.CallExpr:
		m.dropAppended(n)
		m.callToArg(n)
	case *ast.CompositeLit:
		m.dropListed(n)
	case *ast.FuncDecl:
		m.returnInput(n)
	}
	return true
}

// emit records the tree as it is now (a rewrite applied at node) as a
// mutant; orig is node's text before the rewrite.
func (m *mutator) emit(op string, at ast.Node, orig string, mutated ast.Node) {
	var b bytes.Buffer
	if err := (&printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}).Fprint(&b, m.fset, m.file); err != nil {
		m.err = fmt.Errorf("print a %s mutant: %w", op, err)
		return
	}
	pos := m.fset.Position(at.Pos())
	m.out = append(m.out, ownMutant{Op: op, Line: pos.Line, Column: pos.Column, Orig: orig, Mutated: m.text(mutated), Src: b.Bytes()})
}

// text is a node as go/printer prints it, on one line.
func (m *mutator) text(n ast.Node) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, token.NewFileSet(), n)
	return strings.Join(strings.Fields(b.String()), " ")
}

// countShift: a comparison with a whole-number constant N takes N+1, and
// == and != become the counts' <= and >.
func (m *mutator) countShift(e *ast.BinaryExpr) {
	op := e.Op
	lit, litOnLeft := intLit(e.Y), false
	if lit == nil {
		lit, litOnLeft = intLit(e.X), true
	}
	if lit == nil {
		return
	}
	n, err := strconv.ParseUint(lit.Value, 0, 63)
	if err != nil {
		return
	}
	other := e.X
	if litOnLeft {
		other = e.Y
	}
	if b, ok := other.(*ast.BinaryExpr); ok && (b.Op == token.AND || b.Op == token.AND_NOT) {
		return // a bit tested in a mask (m&F != 0) is no count
	}
	if litOnLeft {
		// N op x is x op' N.
		op = map[token.Token]token.Token{token.LSS: token.GTR, token.GTR: token.LSS, token.LEQ: token.GEQ, token.GEQ: token.LEQ, token.EQL: token.EQL, token.NEQ: token.NEQ}[op]
	}
	shifted := map[token.Token]token.Token{token.EQL: token.LEQ, token.NEQ: token.GTR, token.GTR: token.GTR, token.GEQ: token.GEQ, token.LSS: token.LSS, token.LEQ: token.LEQ}[op]
	if shifted == token.ILLEGAL {
		return
	}
	orig := m.text(e)
	saveOp, saveX, saveY := e.Op, e.X, e.Y
	e.X, e.Op, e.Y = other, shifted, &ast.BasicLit{ValuePos: lit.ValuePos, Kind: token.INT, Value: strconv.FormatUint(n+1, 10)}
	m.emit(opCountShift, opAt{e.OpPos}, orig, e)
	e.Op, e.X, e.Y = saveOp, saveX, saveY
}

// opAt is a position to report: a binary expression's operator.
type opAt struct{ pos token.Pos }

func (o opAt) Pos() token.Pos { return o.pos }
func (o opAt) End() token.Pos { return o.pos }

func intLit(e ast.Expr) *ast.BasicLit {
	if l, ok := e.(*ast.BasicLit); ok && l.Kind == token.INT {
		return l
	}
	return nil
}

// dropFlag: a|b made a, and made b. The first is told at b's column, the
// second at the operator's, so that each has a column of its own (a|b|c
// drops c at c, a|b at the second |, b at b, a at the first |).
func (m *mutator) dropFlag(e *ast.BinaryExpr) {
	if e.Op != token.OR {
		return
	}
	orig := m.text(e)
	for _, drop := range []struct {
		keep ast.Expr
		at   token.Pos
	}{{e.X, e.Y.Pos()}, {e.Y, e.OpPos}} {
		undo, ok := replaceExpr(m.file, e, drop.keep)
		if !ok {
			return
		}
		m.emit(opDropFlag, opAt{drop.at}, orig, drop.keep)
		undo()
	}
}

// dropAppended: each element of an append dropped in turn; the spread of
// append(s, xs...) dropped. An element that uses a variable is moved to the
// end and cut off by a reslice (append(s, a, b) -> append(s, b, a)[:len(s)+1])
// rather than dropped from the source: what it alone used (a loop
// variable) would be left unused, and the mutant would not compile.
func (m *mutator) dropAppended(c *ast.CallExpr) {
	if id, ok := c.Fun.(*ast.Ident); !ok || id.Name != "append" || len(c.Args) < 2 {
		return
	}
	orig := m.text(c)
	args, ellipsis := c.Args, c.Ellipsis
	n := len(args) - 1
	for i := 1; i < len(args); i++ {
		rest := append(append([]ast.Expr{}, args[:i]...), args[i+1:]...)
		if m.constant(args[i]) {
			c.Args = rest
			if i == n {
				c.Ellipsis = token.NoPos
			}
			m.emit(opDropElement, args[i], orig, c)
			c.Args, c.Ellipsis = args, ellipsis
			continue
		}
		moved := &ast.CallExpr{Fun: c.Fun, Args: append(rest, args[i]), Ellipsis: token.NoPos}
		if ellipsis.IsValid() && i == n {
			moved.Ellipsis = ellipsis
		}
		var high ast.Expr = &ast.CallExpr{Fun: ast.NewIdent("len"), Args: []ast.Expr{args[0]}}
		if n > 1 {
			high = &ast.BinaryExpr{X: high, Op: token.ADD, Y: &ast.BasicLit{Kind: token.INT, Value: strconv.Itoa(n - 1)}}
		}
		cut := &ast.SliceExpr{X: moved, High: high}
		undo, ok := replaceExpr(m.file, c, cut)
		if !ok {
			continue
		}
		m.emit(opDropElement, args[i], orig, cut)
		undo()
	}
}

// dropListed: each element of a []string literal dropped in turn (moved to
// the end and cut off when it uses a variable, as in dropAppended).
func (m *mutator) dropListed(c *ast.CompositeLit) {
	at, ok := c.Type.(*ast.ArrayType)
	if !ok || at.Len != nil {
		return
	}
	if id, ok := at.Elt.(*ast.Ident); !ok || id.Name != "string" {
		return
	}
	for _, e := range c.Elts {
		if _, keyed := e.(*ast.KeyValueExpr); keyed {
			return
		}
	}
	orig := m.text(c)
	elts := c.Elts
	for i := range elts {
		rest := append(append([]ast.Expr{}, elts[:i]...), elts[i+1:]...)
		if m.constant(elts[i]) {
			c.Elts = rest
			m.emit(opDropElement, elts[i], orig, c)
			c.Elts = elts
			continue
		}
		cut := &ast.SliceExpr{X: &ast.CompositeLit{Type: c.Type, Elts: append(rest, elts[i])}, High: &ast.BasicLit{Kind: token.INT, Value: strconv.Itoa(len(elts) - 1)}}
		undo, ok := replaceExpr(m.file, c, cut)
		if !ok {
			continue
		}
		m.emit(opDropElement, elts[i], orig, cut)
		undo()
	}
}

// constant says whether an expression uses no variable: only literals,
// names qualified by an import, the package's constants, true, false and
// nil. Dropping one leaves nothing unused.
func (m *mutator) constant(e ast.Expr) bool {
	ok := true
	ast.Inspect(e, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.SelectorExpr:
			if x, isID := n.X.(*ast.Ident); isID && m.imports[x.Name] {
				return false
			}
		case *ast.Ident:
			if n.Name != "true" && n.Name != "false" && n.Name != "nil" && !m.consts[n.Name] {
				ok = false
			}
		case *ast.FuncLit:
			ok = false
		}
		return ok
	})
	return ok
}

// returnsFirstParam is the index of the result (of one, or of two whose
// second is an error) whose type is the first parameter's, or -1.
func returnsFirstParam(fd *ast.FuncDecl) int {
	if fd.Body == nil || fd.Type.Params == nil || len(fd.Type.Params.List) == 0 || len(fd.Type.Params.List[0].Names) == 0 || fd.Type.Results == nil {
		return -1
	}
	var results []ast.Expr
	for _, r := range fd.Type.Results.List {
		for range max(1, len(r.Names)) {
			results = append(results, r.Type)
		}
	}
	param := exprString(fd.Type.Params.List[0].Type)
	if strings.HasPrefix(param, "...") {
		return -1
	}
	switch {
	case len(results) == 1 && exprString(results[0]) == param:
		return 0
	case len(results) == 2 && exprString(results[0]) == param && exprString(results[1]) == "error":
		return 0
	}
	return -1
}

func exprString(e ast.Expr) string {
	var b bytes.Buffer
	_ = printer.Fprint(&b, token.NewFileSet(), e)
	return b.String()
}

// returnInput: the body of a function whose first parameter has its
// result's type made `return param` (with a nil error).
func (m *mutator) returnInput(fd *ast.FuncDecl) {
	if returnsFirstParam(fd) < 0 {
		return
	}
	name := fd.Type.Params.List[0].Names[0]
	if name.Name == "_" {
		return
	}
	ret := &ast.ReturnStmt{Return: fd.Body.Lbrace, Results: []ast.Expr{ast.NewIdent(name.Name)}}
	if n := len(fd.Type.Results.List); n == 2 || n == 1 && len(fd.Type.Results.List[0].Names) == 2 {
		ret.Results = append(ret.Results, ast.NewIdent("nil"))
	}
	// The return goes before the body, which stays, unreachable: what it
	// uses (an import, a variable) is still used, so the mutant compiles.
	orig := "func " + fd.Name.Name + " { ... }"
	list := fd.Body.List
	fd.Body.List = append([]ast.Stmt{ret}, list...)
	m.emit(opReturnInput, fd.Name, orig, ret)
	fd.Body.List = list
}

// callToArg: a call of a function that returns its first argument's type
// replaced by that argument.
func (m *mutator) callToArg(c *ast.CallExpr) {
	if len(c.Args) == 0 || c.Ellipsis.IsValid() {
		return
	}
	name := ""
	switch fn := c.Fun.(type) {
	case *ast.Ident:
		if m.identity[fn.Name] {
			name = fn.Name
		}
	case *ast.SelectorExpr:
		if pkg, ok := fn.X.(*ast.Ident); ok && identityCalls[pkg.Name+"."+fn.Sel.Name] {
			name = pkg.Name + "." + fn.Sel.Name
		}
	}
	if name == "" {
		return
	}
	orig := m.text(c)
	arg := c.Args[0]
	undo, ok := replaceExpr(m.file, c, arg)
	if !ok {
		return
	}
	decls := m.file.Decls
	if sel, ok := c.Fun.(*ast.SelectorExpr); ok {
		// var _ = strings.ToLower: the import stays used when this call was
		// its only use, so the mutant compiles.
		m.file.Decls = append(append([]ast.Decl{}, decls...), &ast.GenDecl{Tok: token.VAR, Specs: []ast.Spec{
			&ast.ValueSpec{Names: []*ast.Ident{ast.NewIdent("_")}, Values: []ast.Expr{&ast.SelectorExpr{X: ast.NewIdent(sel.X.(*ast.Ident).Name), Sel: ast.NewIdent(sel.Sel.Name)}}}}})
	}
	m.emit(opReturnInput, c, orig, arg)
	m.file.Decls = decls
	undo()
}

// replaceExpr puts repl where old is in the tree under root, and returns
// how to put old back. An expression that is a statement of its own (a
// call whose result is dropped) is not replaced: a bare value is no
// statement.
func replaceExpr(root ast.Node, old, repl ast.Expr) (undo func(), ok bool) {
	exprType := reflect.TypeOf((*ast.Expr)(nil)).Elem()
	var found reflect.Value
	var walk func(v reflect.Value) bool
	walk = func(v reflect.Value) bool {
		switch v.Kind() {
		case reflect.Pointer:
			if v.IsNil() {
				return false
			}
			if _, isStmt := v.Interface().(*ast.ExprStmt); isStmt && v.Elem().FieldByName("X").Interface() == ast.Expr(old) {
				return true // found, and not replaceable
			}
			if _, isObj := v.Interface().(*ast.Object); isObj {
				return false
			}
			return walk(v.Elem())
		case reflect.Interface:
			if v.IsNil() {
				return false
			}
			if v.Type() == exprType && v.Interface() == ast.Expr(old) {
				if v.CanSet() {
					found = v
				}
				return true
			}
			return walk(v.Elem())
		case reflect.Struct:
			for i := 0; i < v.NumField(); i++ {
				if f := v.Field(i); v.Type().Field(i).IsExported() && walk(f) {
					return true
				}
			}
		case reflect.Slice:
			for i := 0; i < v.Len(); i++ {
				if walk(v.Index(i)) {
					return true
				}
			}
		}
		return false
	}
	walk(reflect.ValueOf(root))
	if !found.IsValid() {
		return nil, false
	}
	found.Set(reflect.ValueOf(repl))
	return func() { found.Set(reflect.ValueOf(old)) }, true
}

// constNames are the constants a file declares at its top level.
func constNames(filename string, src []byte) (map[string]bool, error) {
	f, err := parser.ParseFile(token.NewFileSet(), filename, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, d := range f.Decls {
		if g, ok := d.(*ast.GenDecl); ok && g.Tok == token.CONST {
			for _, sp := range g.Specs {
				for _, n := range sp.(*ast.ValueSpec).Names {
					out[n.Name] = true
				}
			}
		}
	}
	return out, nil
}
