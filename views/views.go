// Package views holds idemlab's templ components and static assets.
//
// Pages are XPage(Page, vm) components rendered inside Layout; partials are
// the fragments htmx swaps. View models are plain structs filled by cmd/web:
// views never call services.
package views

import (
	"embed"
	"io/fs"
)

//go:embed static
var staticFS embed.FS

// Static is the vendored CSS and JavaScript (htmx, Pico) and idemlab's own
// app.css and app.js, served under /static/. Nothing is loaded from a CDN.
var Static, _ = fs.Sub(staticFS, "static")

// Page is what every page's layout needs.
type Page struct {
	Title string
	// Nav names the active navigation item ("policies", "slots", …).
	Nav string
	// User is the signed-in user, nil when signed out.
	User *User
	// CSRF is the token every form posts back (and htmx sends as a header).
	CSRF string
	// Flash is a one-line message shown above the content.
	Flash string
	// Waiting is how many operations wait for a person (admins: the nav's badge).
	Waiting int
	// Demo is DEMO_MODE: the header offers the other demo accounts
	// (SwitchTo) in one click, and admins a link to the demo controls.
	Demo     bool
	SwitchTo []Account
	// Path is this page's own path, where a switch of user comes back to.
	Path string
	// Broken, for an admin, is what /api/v1/invariants reports violated
	// (a recent check, cached): a red banner on every page while it is not empty.
	Broken []string
	// BrokerAway, for an admin, says that the events' broker does not
	// answer and that the outbox keeps every event (an amber banner; ""
	// while it answers).
	BrokerAway string
}

// User is the signed-in user as the layout shows it.
type User struct {
	Name    string
	IsAdmin bool
}

// NavItem is one entry of the top navigation.
type NavItem struct {
	Key, Label, Href string
}

// Nav lists the sections of the app, in the order the header shows them.
var Nav = []NavItem{
	{"policies", "Policies", "/policies"},
	{"slots", "Slots", "/slots"},
	{"provider", "Provider", "/provider"},
	{"payments", "Payments", "/payments"},
	{"operations", "Operations", "/operations"},
	{"recovery", "Recovery", "/recovery"},
	{"events", "Events", "/events"},
	{"labs", "Labs", "/labs"},
}
