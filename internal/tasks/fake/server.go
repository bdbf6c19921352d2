package fake

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/idemlab/idemlab/internal/fault"
	"github.com/idemlab/idemlab/internal/tasks"
)

// maxBody is Cloud Tasks' bound on a task (1 MiB) with room for the JSON.
const maxBody = 1<<20 + 64<<10

// Handler returns the queue's HTTP API (Cloud Tasks' v2 REST shape):
//
//	POST /v2/projects/{p}/locations/{l}/queues/{q}/tasks        create {"task": {…}}
//	GET  /v2/projects/{p}/locations/{l}/queues/{q}/tasks        list (?state=, ?pageSize=)
//	GET  /v2/projects/{p}/locations/{l}/queues/{q}/tasks/{id}   one task with its pushes
//
// and its control API, behind Config.Control:
//
//	POST /v2/reset                                              forget every task
func (q *Queue) Handler() http.Handler {
	mux := http.NewServeMux()
	const queue = "/v2/projects/{project}/locations/{location}/queues/{queue}/tasks"
	mux.HandleFunc("POST "+queue, q.handleCreate)
	mux.HandleFunc("GET "+queue, q.handleList)
	mux.HandleFunc("GET "+queue+"/{task}", q.handleGet)
	mux.HandleFunc("POST /v2/reset", q.cfg.Control.Guard(q.handleReset))
	return mux
}

func queuePathOf(r *http.Request) string {
	return tasks.QueuePath(r.PathValue("project"), r.PathValue("location"), r.PathValue("queue"))
}

// handleCreate: 200 with the task; 409 ALREADY_EXISTS when its name is
// taken (pending, or ran inside the dedupe window); 400 INVALID_ARGUMENT.
func (q *Queue) handleCreate(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Task tasks.Task `json:"task"`
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&body); err != nil {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "the body must be {\"task\": {…}}: "+err.Error())
		return
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "the body must be one JSON object")
		return
	}
	t, err := q.Create(r.Context(), queuePathOf(r), body.Task)
	if err != nil {
		q.writeErr(w, err)
		return
	}
	fault.WriteJSON(w, http.StatusOK, t)
}

func (q *Queue) handleList(w http.ResponseWriter, r *http.Request) {
	state := r.URL.Query().Get("state")
	switch state {
	case "", tasks.StatePending, tasks.StateSucceeded, tasks.StateFailed:
	default:
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "state must be PENDING, SUCCEEDED or FAILED")
		return
	}
	size := 100
	if s := r.URL.Query().Get("pageSize"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", "pageSize must be from 1 to 1000")
			return
		}
		size = n
	}
	list, err := q.List(r.Context(), queuePathOf(r), state, size)
	if err != nil {
		q.writeErr(w, err)
		return
	}
	fault.WriteJSON(w, http.StatusOK, struct {
		Tasks []tasks.Task `json:"tasks"`
	}{list})
}

func (q *Queue) handleGet(w http.ResponseWriter, r *http.Request) {
	t, err := q.Get(r.Context(), queuePathOf(r)+"/tasks/"+r.PathValue("task"))
	if err != nil {
		q.writeErr(w, err)
		return
	}
	fault.WriteJSON(w, http.StatusOK, t)
}

func (q *Queue) handleReset(w http.ResponseWriter, r *http.Request) {
	if err := q.Reset(r.Context()); err != nil {
		q.writeErr(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// writeErr answers err as Cloud Tasks would.
func (q *Queue) writeErr(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, tasks.ErrAlreadyExists):
		writeError(w, http.StatusConflict, "ALREADY_EXISTS", err.Error())
	case errors.Is(err, tasks.ErrNotFound):
		writeError(w, http.StatusNotFound, "NOT_FOUND", err.Error())
	case errors.Is(err, tasks.ErrInvalid):
		writeError(w, http.StatusBadRequest, "INVALID_ARGUMENT", err.Error())
	default:
		q.cfg.Logger.Error("fake tasks", "err", err)
		writeError(w, http.StatusInternalServerError, "INTERNAL", "the queue failed")
	}
}

func writeError(w http.ResponseWriter, code int, status, message string) {
	var e tasks.ErrorBody
	e.Error.Code, e.Error.Status, e.Error.Message = code, status, message
	fault.WriteJSON(w, code, e)
}
