/* Typed access to json-c objects with clear errors ("config.json: field
 * 'hidden_size' must be an integer"). Used by every loader of HF files. */
#ifndef TERN_BASE_JSON_H
#define TERN_BASE_JSON_H

#include <json-c/json.h>
#include <stdint.h>

#include "err.h"

/* Parses a file; the caller owns the result (json_object_put). what names
 * the document in messages. NULL on error. */
json_object *tern_json_parse_file(const char *path, tern_err *err);
/* Parses a buffer of len bytes; NULL with a position on error. */
json_object *tern_json_parse(const char *buf, size_t len, tern_err *err);

/* Field getters: return 0 and fill *out, TERN_ENOTFOUND if the key is absent
 * or null (out untouched), TERN_EFORMAT if it has the wrong type. `doc` names
 * the document for the message. */
int tern_json_get_int(json_object *o, const char *key, int64_t *out, const char *doc, tern_err *err);
int tern_json_get_num(json_object *o, const char *key, double *out, const char *doc, tern_err *err);
int tern_json_get_bool(json_object *o, const char *key, int *out, const char *doc, tern_err *err);
/* Borrowed string, valid while o lives. */
int tern_json_get_str(json_object *o, const char *key, const char **out, const char *doc, tern_err *err);

/* Appends s as a JSON string literal (with quotes) to a malloc'd buffer
 * helper used by CLI printers: writes into out (size cap), returns length
 * needed (like snprintf). */
size_t tern_json_escape(char *out, size_t cap, const char *s, size_t len);

#endif
