// Just enough of a JSON reader for one request line: objects, strings, integers, true,
// false, null, and skipping any other value whole.
//
// Values are nested at most MaxDepth deep: skipping one is recursive, and a line of 200,000
// nested arrays would otherwise end the process with a stack overflow, which no handler
// code can catch.
//
// The host reads nothing else, and no payload is ever parsed (data_json is a string), so
// a general JSON library would only add its start-up to every process the kit starts:
// Mono compiles a library from the system's assembly cache anew in each process, and a
// run starts one per test case. Without one the host's assembly needs no package.

using System;
using System.Globalization;
using System.Text;

namespace Dsm.DataStateMachine.Protocol
{
    /// <summary>A line that is not the JSON the reader expected at <see cref="Position"/>.</summary>
    internal sealed class JsonLineException : FormatException
    {
        public JsonLineException(string message, int position) : base(message + " at character " + position)
        {
            Position = position;
        }

        public int Position { get; }
    }

    internal enum JsonKind
    {
        Object,
        Array,
        String,
        Number,
        True,
        False,
        Null,
    }

    internal sealed class JsonLine
    {
        /// <summary>
        /// How deep values may nest. A request nests two levels (the request, its context);
        /// the bound leaves fields of later protocol versions room, and the stack a margin.
        /// </summary>
        public const int MaxDepth = 64;

        private readonly string text;
        private int at;
        private int depth;
        private StringBuilder scratch;

        public JsonLine(string text)
        {
            this.text = text;
        }

        /// <summary>What the next value is, without reading it.</summary>
        public JsonKind Peek()
        {
            SkipSpace();
            if (at >= text.Length) throw Error("a value was expected");
            switch (text[at])
            {
                case '{': return JsonKind.Object;
                case '[': return JsonKind.Array;
                case '"': return JsonKind.String;
                case 't': return JsonKind.True;
                case 'f': return JsonKind.False;
                case 'n': return JsonKind.Null;
                default:
                    char c = text[at];
                    if (c == '-' || (c >= '0' && c <= '9')) return JsonKind.Number;
                    throw Error("unexpected character " + DsmException.Echo(c.ToString()));
            }
        }

        /// <summary>
        /// Reads <c>{</c>, or the <c>,</c> between members, and the next member's name;
        /// false at the closing <c>}</c>. Call with <paramref name="first"/> true for the first member.
        /// </summary>
        public bool NextMember(bool first, out string name)
        {
            name = null;
            SkipSpace();
            if (first)
            {
                Expect('{');
                SkipSpace();
                if (Take('}')) return false;
            }
            else
            {
                if (Take('}')) return false;
                Expect(',');
                SkipSpace();
            }
            name = ReadString();
            SkipSpace();
            Expect(':');
            return true;
        }

        /// <summary>
        /// Reads <c>[</c>, or the <c>,</c> between elements; false at the closing <c>]</c>.
        /// Call with <paramref name="first"/> true for the first element, then read the element.
        /// </summary>
        public bool NextElement(bool first)
        {
            SkipSpace();
            if (first)
            {
                Expect('[');
                SkipSpace();
                return !Take(']');
            }
            if (Take(']')) return false;
            Expect(',');
            return true;
        }

        public string ReadString()
        {
            SkipSpace();
            Expect('"');
            int start = at;
            while (at < text.Length)
            {
                char c = text[at];
                if (c == '"')
                {
                    at++;
                    return text.Substring(start, at - 1 - start);
                }
                if (c == '\\') return ReadEscaped(start);
                if (c < 0x20) throw Error("a control character inside a string");
                at++;
            }
            throw Error("a string that does not end");
        }

        private string ReadEscaped(int start)
        {
            var into = scratch ?? (scratch = new StringBuilder());
            into.Clear();
            into.Append(text, start, at - start);
            while (at < text.Length)
            {
                char c = text[at++];
                if (c == '"') return into.ToString();
                if (c != '\\')
                {
                    if (c < 0x20) throw Error("a control character inside a string");
                    into.Append(c);
                    continue;
                }
                if (at >= text.Length) break;
                char e = text[at++];
                switch (e)
                {
                    case '"': into.Append('"'); break;
                    case '\\': into.Append('\\'); break;
                    case '/': into.Append('/'); break;
                    case 'b': into.Append('\b'); break;
                    case 'f': into.Append('\f'); break;
                    case 'n': into.Append('\n'); break;
                    case 'r': into.Append('\r'); break;
                    case 't': into.Append('\t'); break;
                    case 'u':
                        int code;
                        if (at + 4 > text.Length
                            || !int.TryParse(text.Substring(at, 4), NumberStyles.AllowHexSpecifier, CultureInfo.InvariantCulture, out code))
                        {
                            throw Error("a \\u escape without four hex digits");
                        }
                        into.Append((char)code); // a lone surrogate stays one, as it was sent
                        at += 4;
                        break;
                    default:
                        throw Error("an unknown escape \\" + e);
                }
            }
            throw Error("a string that does not end");
        }

        /// <summary>An integer written without a fraction or an exponent, or false (the value is read either way).</summary>
        public bool TryReadInteger(out long value)
        {
            value = 0;
            SkipSpace();
            int start = at;
            if (at < text.Length && text[at] == '-') at++;
            while (at < text.Length && text[at] >= '0' && text[at] <= '9') at++;
            int end = at;
            bool whole = at < text.Length ? text[at] != '.' && text[at] != 'e' && text[at] != 'E' : true;
            SkipNumberRest();
            if (!whole || end == start) return false;
            return long.TryParse(text.Substring(start, end - start), NumberStyles.AllowLeadingSign, CultureInfo.InvariantCulture, out value);
        }

        public bool ReadBoolean()
        {
            if (Take("true")) return true;
            if (Take("false")) return false;
            throw Error("true or false was expected");
        }

        /// <summary>Reads <c>null</c> if it is next; false (nothing read) otherwise.</summary>
        public bool TakeNull()
        {
            SkipSpace();
            return Take("null");
        }

        /// <summary>Skips the next value, whatever it is, objects and arrays whole.</summary>
        public void Skip()
        {
            switch (Peek())
            {
                case JsonKind.Object:
                case JsonKind.Array:
                    if (depth == MaxDepth) throw Error("values nested deeper than " + MaxDepth + " levels");
                    depth++;
                    SkipContainer();
                    depth--;
                    return;
                case JsonKind.String:
                    ReadString();
                    return;
                case JsonKind.Number:
                    long number;
                    TryReadInteger(out number);
                    return;
                case JsonKind.True:
                case JsonKind.False:
                    ReadBoolean();
                    return;
                default:
                    if (!TakeNull()) throw Error("null was expected");
                    return;
            }
        }

        private void SkipContainer()
        {
            if (Peek() == JsonKind.Object)
            {
                string ignored;
                bool first = true;
                while (NextMember(first, out ignored))
                {
                    first = false;
                    Skip();
                }
                return;
            }
            Expect('[');
            SkipSpace();
            if (Take(']')) return;
            while (true)
            {
                Skip();
                SkipSpace();
                if (Take(']')) return;
                Expect(',');
            }
        }

        /// <summary>Nothing but white space is left.</summary>
        public void End()
        {
            SkipSpace();
            if (at != text.Length) throw Error("more after the request object");
        }

        private void SkipNumberRest()
        {
            while (at < text.Length && "0123456789.eE+-".IndexOf(text[at]) >= 0) at++;
        }

        private void SkipSpace()
        {
            while (at < text.Length && (text[at] == ' ' || text[at] == '\t' || text[at] == '\r' || text[at] == '\n')) at++;
        }

        private bool Take(char c)
        {
            if (at < text.Length && text[at] == c)
            {
                at++;
                return true;
            }
            return false;
        }

        private bool Take(string word)
        {
            if (string.CompareOrdinal(text, at, word, 0, word.Length) != 0) return false;
            at += word.Length;
            return true;
        }

        private void Expect(char c)
        {
            if (!Take(c)) throw Error("'" + c + "' was expected");
        }

        private JsonLineException Error(string what)
        {
            return new JsonLineException("not JSON: " + what, at);
        }
    }
}
